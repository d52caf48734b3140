"""Where the engine's decode step could lose to the same step outside it: other threads, the engine's cache, its
loop, its debug log, its archive.

`bench/gpu_decode_gap.py` on an H100 (131,072 keys, 8-bit KV, Qwen3-32B shape; run a, docs/benchmarks.md) paced
`engine.generate.decode`'s tokens at 16.46 ms alone and at 20.29 ms when each token went to an asyncio loop on
another thread, and an engine ask at 20.88 ms; run w (H200, `bench/gpu_engine.py`) had the engine's 8-bit asks
2.3-3.8 ms a token over their raw step. This bench puts each suspect in a row of its own, in one process, one
filled cache and the path the engine chooses (`--config`); in its H100 runs (c, d) no row differed from the
loop alone by more than 0.4 ms but the spinner's with bf16 KV:

- ``alone``: the decode loop, nothing else running;
- ``event loop``: each token handed to an asyncio loop on its own thread (`call_soon_threadsafe`);
- ``condition waiter``: each token handed to a thread blocked on a `threading.Condition` (as
  `RequestHandle.__iter__` reads them);
- ``event loop, every 50 ms``: the event loop woken at most every 50 ms (the tokens since handed over together):
  whether the cost is per wake-up;
- ``idle thread``: a thread blocked in `select` that is never woken (a thread alone costs nothing?);
- ``event loop, switch 0.25 ms``: the event loop with `sys.setswitchinterval(0.00025)` (CPython's default is
  5 ms: how long a thread that wants the GIL waits before it asks the holder to drop it);
- ``spinner``: a thread running Python without pause; its count per phase of the step says in which phases the
  decode thread lets go of the GIL (building the step, `mx.async_eval`, reading the token);
- ``spinner, switch 20 ms``: the same with a 20 ms switch interval: whether a longer one keeps a busy thread out of
  a step's building (run d: bf16's step went from 21.0 to 27.6 ms beside the spinner);
- ``another thread``: the loop on a thread of its own (as the engine's worker runs it), nothing else running;
- ``alone, at the asks' length``: the loop over a filled cache of the follow-up ask's key count (the prompt's 45
  more rows than `--length`: a count that is not a multiple of the kernels' tiles);
- ``engine ask``: an engine (`--archive`, off by default) asked twice over a synthetic repository of `--length`
  tokens; the second ask's decode as its caller reads it (token gap p50; the engine's host milliseconds a step);
- ``engine's cache``: the loop over that engine's own cache once it is idle, on this thread: the cache a real
  prefill left against the filled one above;
- ``engine's loop, cache``: `engine.generate.decode` over that cache on this thread;
- ``engine's cache, writes paused``: the first of the two with the archive's writes paused, as during a request (the
  two before have them go on beside the loop);
- ``engine ask, no debug log``: an ask read without `request_profile.ForwardLog` (the engine's DEBUG lines off);
- ``engine ask, again``: one more ask, for the spread;
- ``engine ask, MLX's cache emptied first``: `mx.clear_cache()` before the ask: whether buffers MLX keeps for reuse
  (among them the archive writer's, which the host read: MLX moves such a buffer to CUDA managed memory) slow it.

The engine's rows give MLX's cached memory as the ask started (``held_gib``: active, cached) or as the loop
started (``cached_gib``); ``--engine-only`` leaves out the rows with a thread beside the loop.

Each row: the median token gap, and the median host milliseconds per step in each phase (and in the hand-off).

    # on the lent GPU (device tool, carry [".gpu"]), about 2-3 minutes a configuration (1.8 warm):
    bash .gpu/install.sh > /dev/null 2>&1
    python3 bench/gpu_handoff.py --out $OUT/gpu_handoff.json
    python3 bench/gpu_handoff.py --config window-16 --archive on --out $OUT/h16.json
    python3 bench/gpu_handoff.py --archive on --length 32768 --engine-only --out $OUT/h8-32k.json
    python bench/gpu_handoff.py --small     # CPU smoke run (tiny 4-bit model, 4,096 keys)
"""
from __future__ import annotations

import argparse
import contextlib
import selectors
import socket
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

from bench import request_profile  # noqa: E402
from bench._common import save_json  # noqa: E402
from bench.gpu_decode_gap import decode_gap, event_loop, step_arguments  # noqa: E402
from bench.gpu_workload import synthetic_repository  # noqa: E402
from engine.request import Request, TokenEvent  # noqa: E402
from engine.sampling import greedy  # noqa: E402
from engine.step_measure import filled_cache  # noqa: E402
from engine.window import WindowPolicy  # noqa: E402

HandOff = Callable[[int], None]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = step_arguments(__doc__, 64)
    ap.add_argument("--archive", choices=("off", "on"), default="off",
                    help="the engine's disk archive (on: its writes go on between the asks, as in bench/gpu_engine.py)")
    ap.add_argument("--engine-only", action="store_true", help="the loop alone and the engine's rows, no thread rows")
    ap.add_argument("--out", default="bench/results/gpu_handoff.json")
    return ap.parse_args(argv)


class Spinner:
    """A thread counting in a Python loop for as long as it runs."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop:
            self.count += 1

    def __enter__(self) -> "Spinner":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()


def steps_loop(path: Any, cache: list, steps: int, hand_off: HandOff | None, spinner: Spinner | None) -> dict:
    """`engine.generate.decode`'s pipelined loop written out with a clock (and the spinner's count) at each phase:
    build step n + 1 from lazy token n, submit it, read token n, hand it off."""
    offset = cache[0].offset
    token = greedy(mx.random.normal((1, path.model.args.vocab_size)))
    mx.async_eval(token)
    stamps, phases, spins, handing = [], [], [], []
    count = (lambda: spinner.count) if spinner is not None else (lambda: 0)
    for _ in range(steps + 4):
        t0, c0 = time.perf_counter(), count()
        nxt = greedy(path.forward(token.reshape(1, 1), cache, logits="last")[:, -1, :])
        t1, c1 = time.perf_counter(), count()
        mx.async_eval(nxt)
        t2, c2 = time.perf_counter(), count()
        token_id = int(token.item())
        t3, c3 = time.perf_counter(), count()
        stamps.append(t3)
        phases.append((t1 - t0, t2 - t1, t3 - t2))
        spins.append((c1 - c0, c2 - c1, c3 - c2))
        if hand_off is not None:
            hand_off(token_id)
        handing.append(time.perf_counter() - t3)
        token = nxt
    token.item()
    for c in cache:
        c.offset = offset
    gaps = [b - a for a, b in zip(stamps[4:], stamps[5:])]
    row = dict(gap_ms=round(statistics.median(gaps) * 1e3, 2),
               **{f"{name}_ms": round(statistics.median(p[i] for p in phases[4:]) * 1e3, 2)
                  for i, name in enumerate(("build", "submit", "read"))},
               hand_off_ms=round(statistics.median(handing[4:]) * 1e3, 3))
    if spinner is not None:
        row.update({f"spins_{name}_per_ms": round(sum(s[i] for s in spins[4:]) / sum(p[i] for p in phases[4:]) / 1e3)
                    for i, name in enumerate(("build", "submit", "read"))})
    return row


def coalesced(hand_off: HandOff, seconds: float) -> HandOff:
    """`hand_off` called at most every `seconds` (with the last token; the ones between are dropped here, where
    the engine would hand them over together)."""
    last = [0.0]

    def maybe(token: int) -> None:
        now = time.perf_counter()
        if now - last[0] >= seconds:
            last[0] = now
            hand_off(token)

    return maybe


@contextlib.contextmanager
def condition_waiter() -> Iterator[HandOff]:
    cond, tokens, state = threading.Condition(), [], {"read": 0, "stop": False}

    def wait() -> None:
        while True:
            with cond:
                cond.wait_for(lambda: state["read"] < len(tokens) or state["stop"])
                if state["stop"]:
                    return
                state["read"] += 1

    def hand_off(token: int) -> None:
        with cond:
            tokens.append(token)
            cond.notify_all()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        yield hand_off
    finally:
        with cond:
            state["stop"] = True
            cond.notify_all()
        thread.join()


@contextlib.contextmanager
def idle_thread() -> Iterator[None]:
    a, b = socket.socketpair()
    selector = selectors.DefaultSelector()
    selector.register(a, selectors.EVENT_READ)
    thread = threading.Thread(target=selector.select, daemon=True)
    thread.start()
    try:
        yield None
    finally:
        b.send(b"x")
        thread.join()
        selector.close()
        a.close()
        b.close()


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def engine_rows(run: Any, a: argparse.Namespace, rows: list[dict]) -> None:
    """The engine's asks, and loops over the cache they left (module docstring)."""
    repo = synthetic_repository(run.lengths[0], run.model.args.vocab_size)
    eng = run.engine(a.config, archive=a.archive == "on")

    def add(row: dict) -> None:
        rows.append(row)
        print(row, flush=True)

    def ask(name: str, prompt: list) -> None:
        asked = ge.ask(eng, prompt, a.steps + 8)
        host = asked["decode_host_ms"] or {}
        add(dict(gap_ms=asked["token_gaps"]["p50"], build_ms=host.get("build"), submit_ms=host.get("submit"),
                 read_ms=host.get("wait"), decode_tps=asked["decode_tps"], row=name,
                 step_traces_fallbacks=asked["step_traces_fallbacks"], held_gib=asked["held_gib"]))

    def ask_unlogged(name: str, prompt: list) -> None:  # read without `request_profile.ForwardLog`
        ge.idle(eng)
        handle, arrivals = eng.submit(Request(segments=prompt, max_tokens=a.steps + 8)), []
        for event in handle:
            if isinstance(event, TokenEvent):
                arrivals.append((time.perf_counter(), len(event.token_ids)))
        done = handle.result()
        add(dict(gap_ms=request_profile.token_gaps(arrivals)["p50"], decode_tps=round(done.metrics.decode_tps, 2),
                 row=name))

    def loop(name: str, over_cache: Callable[..., dict], writes: contextlib.AbstractContextManager) -> None:
        ge.idle(eng)
        offset, cached = eng.prefix.cache[0].offset, round(mx.get_cache_memory() / 2**30, 2)
        with writes:
            add(dict(over_cache(eng.compute, eng.prefix.cache, a.steps), row=name, cached_gib=cached))
        for c in eng.prefix.cache:  # the rows past it are unused: the next ask restores its line as always
            c.offset = offset

    def loop_alone(path: Any, cache: list, steps: int) -> dict:
        return steps_loop(path, cache, steps, None, None)

    try:
        ge.ask(eng, repo.prompt(1), 4)
        ask("engine ask", repo.prompt(2))
        loop("engine's cache", loop_alone, contextlib.nullcontext())  # the archive's writes go on beside it
        loop("engine's loop, cache", decode_gap, contextlib.nullcontext())
        loop("engine's cache, writes paused", loop_alone, eng.prefix.request_scope())
        ask_unlogged("engine ask, no debug log", repo.prompt(3))
        ask("engine ask, again", repo.prompt(4))
        ge.idle(eng)
        mx.clear_cache()  # buffers MLX keeps for reuse given back to CUDA before the ask
        ask("engine ask, MLX's cache emptied first", repo.prompt(5))
    finally:
        ge.close(eng)
        eng = None  # (the helpers above hold it only through this name)
        ge.free()


def thread_rows(a: argparse.Namespace, path: Any, cache: list, rows: list[dict], add: Callable[..., None]) -> None:
    """The rows with another thread beside the loop (module docstring), over the filled cache."""
    with event_loop() as hand_off:
        add("event loop", hand_off)
    with event_loop() as hand_off:
        add("event loop, every 50 ms", coalesced(hand_off, 0.05))
    with condition_waiter() as hand_off:
        add("condition waiter", hand_off)
    with idle_thread():
        add("idle thread")
    with switch_interval(0.00025), event_loop() as hand_off:
        add("event loop, switch 0.25 ms", hand_off)
    with Spinner() as spinner:
        add("spinner", spinner=spinner)
    with switch_interval(0.02), Spinner() as spinner:
        add("spinner, switch 20 ms", spinner=spinner)
    add("alone, again")
    on_thread: list[dict] = []
    thread = threading.Thread(target=lambda: on_thread.append(steps_loop(path, cache, a.steps, None, None)))
    thread.start()
    thread.join()
    rows.append(dict(on_thread[0], row="another thread"))
    print(rows[-1], flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    base = ["--small"] if a.small else ["--device", "gpu", "--blas", "off"]
    run = ge.Run(ge.parse_args([*base, "--lengths", str(4096 if a.small else a.length), "--configs", a.config,
                                "--archive", "off"]))
    mx.set_default_device(mx.gpu if run.a.device == "gpu" else mx.cpu)
    length, rows = run.lengths[0], []
    ge.warm_up(run, a.config, length)
    windowed, bits = ge.CONFIGS[a.config][:2]
    path = ge.choose(run.model, run.options(a.config))
    cache = filled_cache(run.model, run.window if windowed else WindowPolicy(enabled=False), bits, length)
    steps_loop(path, cache, 8, None, None)  # the buffers grow once and the graphs are built, untimed

    def add(name: str, hand_off: HandOff | None = None, spinner: Spinner | None = None) -> None:
        row = dict(steps_loop(path, cache, a.steps, hand_off, spinner), row=name)
        rows.append(row)
        print(row, flush=True)

    add("alone")
    if not a.engine_only:
        thread_rows(a, path, cache, rows, add)
    cache.clear()  # its buffers freed before the next cache
    ge.free()
    asked_length = synthetic_repository(length, run.model.args.vocab_size).prompt(2)
    cache += filled_cache(run.model, run.window if windowed else WindowPolicy(enabled=False), bits,
                          sum(len(s.token_ids) for s in asked_length))
    steps_loop(path, cache, 8, None, None)
    add("alone, at the asks' length")
    cache.clear()  # freed before the engine builds its own
    ge.free()
    engine_rows(run, a, rows)
    result = dict(config=a.config, length=length, archive=a.archive, steps=a.steps, mlx=mx.__version__,
                  device_info=mx.device_info(), python=sys.version.split()[0], rows=rows)
    print("\n| row | token gap ms | build ms | submit ms | read ms |\n|---|---:|---:|---:|---:|")
    for r in rows:
        host = [r.get(f"{name}_ms", "") for name in ("build", "submit", "read")]
        print(f"| {r['row']} | {r['gap_ms']} | {' | '.join(map(str, host))} |")
    save_json(result, a.out, quiet=True)
    return result


if __name__ == "__main__":
    main()
