"""Where the engine's decode step loses to the same step outside it (run w, H200, 131,072 keys: the 8-bit
step's token gap 16.7-18.2 ms in the engine against 14.40 ms in `bench/gpu_engine.py`'s raw step).

One process, the Qwen3-32B-shaped random model, one configuration (`--config`), `--length` keys; each row
is a decode of `--steps` tokens after a few untimed ones, its median token gap and, where the loop is the
engine's, its host times (building a step; submitting it with `mx.async_eval`):

1. ``raw, no engine``: `bench/gpu_step.decode_steps`' pipelined loop over a filled cache (as run w's raw step);
2. ``engine ask``: an engine (archive off) asked twice over a synthetic repository; the second ask's decode;
3. ``raw, engine alive``: 1 again while that engine holds its cache and checkpoints (memory, allocator);
4. ``raw, engine's path``: 1 through the engine's own `ComputePath` (its trace, its kernel switches);
5. ``engine loop``: `engine.generate.decode` (the engine's pipelined loop and greedy sampler) on that path;
6. ``engine loop + event loop``: 5 with each token handed to an asyncio loop on another thread, as the
   engine's callers stream it;
7. ``raw, engine closed``: 1 once more.

    # on the lent H200 (device tool, needs_h200, carry [".gpu"]), about 3 minutes:
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_decode_gap.py --out $OUT/gpu_decode_gap.json
    python bench/gpu_decode_gap.py --small     # CPU smoke run (tiny 4-bit model, 4,096 keys)
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import gpu_engine as ge  # noqa: E402 (applies MLX's environment first)

import mlx.core as mx  # noqa: E402

from bench._common import save_json  # noqa: E402
from bench.gpu_step import decode_steps  # noqa: E402
from bench.gpu_workload import synthetic_repository  # noqa: E402
from engine import generate  # noqa: E402
from engine.sampling import greedy  # noqa: E402
from engine.step_measure import filled_cache  # noqa: E402
from engine.window import WindowPolicy  # noqa: E402


def step_arguments(doc: str, steps: int) -> argparse.ArgumentParser:
    """The arguments this bench and `bench/gpu_handoff.py` share: the model, the keys, the configuration, the steps."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny 4-bit model on the CPU, 4,096 keys (a smoke run)")
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--config", default="window-8", choices=sorted(ge.CONFIGS))
    ap.add_argument("--steps", type=int, default=steps)
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = step_arguments(__doc__, 48)
    ap.add_argument("--out", default="bench/results/gpu_decode_gap.json")
    return ap.parse_args(argv)


def engine_args(a: argparse.Namespace) -> list[str]:
    """`bench/gpu_engine.py`'s arguments for the same model and configuration (its `Run` builds them)."""
    base = ["--small"] if a.small else ["--device", "gpu", "--blas", "off"]
    return [*base, "--lengths", str(4096 if a.small else a.length), "--configs", a.config, "--archive", "off",
            "--decode", str(a.steps + 8)]


def gaps_ms(stamps: list[float]) -> float:
    return round(statistics.median(b - a for a, b in zip(stamps, stamps[1:])) * 1e3, 2)


def raw(run: Any, path: Any, length: int, steps: int) -> dict[str, Any]:
    """Row 1's loop over a fresh filled cache through `path`."""
    bits = ge.CONFIGS[run.a.configs][1]
    policy = run.window if ge.CONFIGS[run.a.configs][0] else WindowPolicy(enabled=False)
    cache = filled_cache(run.model, policy, bits, length)
    decode_steps(path, cache, 2, (False, False, "cores"), "sync", attempts=1)  # the buffers grow once, untimed
    times = decode_steps(path, cache, steps, (False, False, "cores"), "pipelined", attempts=3)
    del cache
    return dict(gap_ms=round(times.seconds * 1e3, 2), build_ms=round(times.python * 1e3, 2),
                submit_ms=round((times.host - times.python) * 1e3, 2))


def decode_gap(path: Any, cache: list, steps: int, hand_off: Callable[[int], None] | None = None) -> dict:
    """`engine.generate.decode` over `cache` through `path` for `steps` + 4 tokens, each to `hand_off` if given:
    the median gap between tokens after the first four."""
    logits = mx.random.normal((1, path.model.args.vocab_size))
    stamps: list[float] = []
    for token in generate.decode(path, cache, logits, greedy, max_tokens=steps + 4):
        stamps.append(time.perf_counter())
        if hand_off is not None:
            hand_off(token)
    return dict(gap_ms=gaps_ms(stamps[4:]))


def engine_loop(run: Any, path: Any, length: int, steps: int, hand_off: Callable[[int], None] | None) -> dict:
    """`decode_gap` over a fresh filled cache through `path`."""
    bits = ge.CONFIGS[run.a.configs][1]
    policy = run.window if ge.CONFIGS[run.a.configs][0] else WindowPolicy(enabled=False)
    cache = filled_cache(run.model, policy, bits, length)
    row = decode_gap(path, cache, steps, hand_off)
    del cache
    return row


@contextlib.contextmanager
def event_loop() -> Iterator[Callable[[int], None]]:
    """A hand-off that streams each token (as a small text) to an asyncio loop on its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    received: list[str] = []
    try:
        yield lambda token: loop.call_soon_threadsafe(received.append, f"<{token}>")
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    run = ge.Run(ge.parse_args(engine_args(a)))
    mx.set_default_device(mx.gpu if run.a.device == "gpu" else mx.cpu)
    length, steps, rows = run.lengths[0], a.steps, []

    def add(name: str, row: dict[str, Any]) -> None:
        rows.append(dict(row, row=name))
        print(f"{name}: {row}", flush=True)

    ge.warm_up(run, run.a.configs, length)
    add("raw, no engine", raw(run, ge.choose(run.model, run.options(run.a.configs)), length, steps))
    ge.free()
    repo = synthetic_repository(length, run.model.args.vocab_size)
    eng = run.engine(run.a.configs, archive=False)
    ge.ask(eng, repo.prompt(1), 4)
    asked = ge.ask(eng, repo.prompt(2), steps + 8)
    add("engine ask", dict(gap_ms=asked["token_gaps"]["p50"], host=asked["decode_host_ms"],
                           decode_tps=asked["decode_tps"]))
    add("raw, engine alive", raw(run, ge.choose(run.model, run.options(run.a.configs)), length, steps))
    add("raw, engine's path", raw(run, eng.compute, length, steps))
    add("engine loop", engine_loop(run, eng.compute, length, steps, None))
    with event_loop() as hand_off:
        add("engine loop + event loop", engine_loop(run, eng.compute, length, steps, hand_off))
    ge.close(eng)
    del eng
    ge.free()
    add("raw, engine closed", raw(run, ge.choose(run.model, run.options(run.a.configs)), length, steps))
    result = dict(config=a.config, length=length, steps=steps, mlx=mx.__version__, device_info=mx.device_info(),
                  decode_kernels=run.result.get("decode_kernels"), rows=rows)
    print("\n| row | token gap ms | build ms | submit ms |\n|---|---:|---:|---:|")
    for r in rows:
        host = r.get("host") or {}
        print(f"| {r['row']} | {r['gap_ms']} | {r.get('build_ms', host.get('build', ''))} | "
              f"{r.get('submit_ms', host.get('submit', ''))} |")
    save_json(result, a.out, quiet=True)
    return result


if __name__ == "__main__":
    main()
