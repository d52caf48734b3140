"""Engine-level GPU benchmark: the edit loop at long context through `Engine`, bounds beside each figure.

A random-weight model (bench/prefill.py's shapes: Qwen3-32B, 4-bit group 64, bf16) and a synthetic repository prompt
laid out as segments with a hot tail (bench/gpu_workload.py), all through `engine.Engine` with checkpoints and the
disk archive on. Per length, in one run:

- linear mode: what the engine measured at load (`engine.linear_mode`), and greedy output and last-position logits
  of a short prompt under both modes (against the logit difference two prefill chunkings give, which it accepts);
- configurations ``window-16`` / ``window-8`` (block window G, W, dense tail; fp16 / 8-bit KV): cold ask, follow-up
  question, edit a file in the middle then ask, restart (new `Engine`, same archive, page cache dropped where
  allowed) then ask with prompt-lookup speculation;
- ``dense-16`` / ``dense-8``: cold ask (exact attention); ``window-16-q`` (``--compare-linear``): cold ask, quantized;
- every ask decodes ``--decode`` tokens: decode tok/s at that context, the spacing of its tokens (``token_gaps``) and
  the engine's host milliseconds per step (``decode_host_ms``: building the step's graph, submitting it, waiting for
  its token), and how often its compiled step traced and fell back (``step_traces_fallbacks``);
- ``--raw-step``: after each configuration, the same decode step outside the engine in the same process
  (bench/gpu_step.py's pipelined loop with the path that configuration's engine chose), and before its engine
  closes the same loop over that engine's own cache and path (writes paused); ``--archive off``: the
  same asks with no disk archive and no restart row (what its background writes cost);
- bounds, measured in the same run (bench/gpu_bounds.py): bf16 matmul TFLOP/s, device copy bandwidth (decode bound =
  bandwidth / bytes read per token), disk read bandwidth (restart bound = bytes restored / bandwidth).

    python bench/gpu_engine.py --small    # tiny 4-bit model on the CPU, 4k tokens, end to end
    bash .gpu/install.sh && python3 bench/gpu_engine.py --device gpu --lengths 131072   # the H200 (carry [".gpu"])

Prints a Markdown table and writes JSON after every row (default bench/results/gpu_engine-<shape>-<lengths>.json).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import blas_arguments, preload_blas, save_json  # noqa: E402

preload_blas()  # before MLX is imported

import mlx.core as mx  # noqa: E402

from bench import gpu_bounds, request_profile  # noqa: E402
from bench.gpu_agreement import linear_agreement  # noqa: E402
from bench.gpu_report import goals, table  # noqa: E402
from bench.gpu_workload import random_loaded, synthetic_repository  # noqa: E402
from bench.prefill import SHAPES, Shape, attention_flops, linear_flops_per_token  # noqa: E402
from engine import mlx_env  # noqa: E402
from engine.compute import ComputeOptions, choose  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.request import Priority, Request, TokenEvent  # noqa: E402
from engine.window import WindowPolicy  # noqa: E402

TINY_Q4 = Shape("qwen3", dict(SHAPES["tiny"].args, model_type="qwen3", vocab_size=2048, tie_word_embeddings=False),
                4, "bfloat16", 512, 512, 256)
CONFIGS = {  # name -> (windowed, kv bits, whole loop, linear setting or None for --linear)
    "window-16": (True, 16, True, None), "window-8": (True, 8, True, None),
    "dense-16": (False, 16, False, None), "dense-8": (False, 8, False, None),
    "window-16-q": (True, 16, False, "quantized"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny 4-bit qwen3 on the CPU, 4096 tokens (a smoke run)")
    ap.add_argument("--lengths", default=None, help="prompt tokens, comma-separated (default 32768; 4096 with --small)")
    ap.add_argument("--device", choices=("cpu", "gpu"), default=None, help="default: gpu (cpu with --small)")
    ap.add_argument("--configs", default="window-16,dense-16,window-8,dense-8")
    ap.add_argument("--compare-linear", action="store_true", help="add window-16-q (quantized kernel forced)")
    ap.add_argument("--linear", default="auto", help="compute.linear for every other configuration")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=64, help="tokens decoded per ask")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (smoke runs)")
    ap.add_argument("--disk-gib", type=float, default=4.0, help="size of the disk read probe")
    ap.add_argument("--archive", choices=("on", "off"), default="on",
                    help="off: no disk archive (no restart row): what archive writes cost the asks beside them")
    ap.add_argument("--home", default=None, help="CODECTX_HOME for the run (default: a new temp folder)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the follow-up and edit asks on the engine's worker (top functions in each row)")
    ap.add_argument("--raw-step", action="store_true", help="after each configuration, its step outside the engine")
    blas_arguments(ap)
    a = ap.parse_args(argv)
    if a.small:
        a.lengths, a.chunk, a.decode, a.disk_gib = a.lengths or "4096", 256, 16, 0.25
    a.lengths = a.lengths or "32768"
    a.device = a.device or ("cpu" if a.small else "gpu")
    if a.compare_linear:
        a.configs += ",window-16-q"
    return a


class Run:
    """One benchmark process: the model, the settings, the results written after every row."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.shape = TINY_Q4 if a.small else SHAPES["qwen3-32b"]
        self.shape_name = "tiny-q4" if a.small else "qwen3-32b"
        self.lengths = [int(n) for n in a.lengths.split(",")]
        self.home = Path(a.home or tempfile.mkdtemp(prefix="codectx-gpu-bench-"))
        os.environ["CODECTX_HOME"] = str(self.home)
        start = time.perf_counter()
        self.loaded = random_loaded(self.shape, self.shape_name, a.layers, max(self.lengths) + 8192)
        self.build_s = time.perf_counter() - start
        self.model = self.loaded.model
        self.window = WindowPolicy(global_tokens=self.shape.global_tokens, window_tokens=self.shape.window_tokens,
                                   dense_tail=self.shape.dense_tail)
        self.out = Path(a.out or f"bench/results/gpu_engine-{self.shape_name}-{a.lengths.replace(',', '-')}.json")
        self.result: dict[str, Any] = dict(
            shape=self.shape_name, device=a.device, chunk=a.chunk, decode=a.decode, window=self.window.__dict__,
            archive=a.archive, mlx_env=mlx_env.current(),
            layers=self.model.args.num_hidden_layers, build_s=round(self.build_s, 1), mlx=mx.__version__,
            platform=platform.platform(), device_info=mx.device_info(), rows=[])

    def save(self) -> None:
        save_json(self.result, str(self.out), quiet=True)

    def add(self, row: dict[str, Any]) -> None:
        self.result["rows"].append(row)
        print(json.dumps(row, default=str), file=sys.stderr, flush=True)
        self.save()

    def options(self, config: str) -> ComputeOptions:
        """The compute settings of `config`'s engines."""
        return ComputeOptions(linear=CONFIGS[config][3] or self.a.linear, blas=self.a.blas)

    def engine(self, config: str, *, speculation: str = "off", archive: bool = True) -> Engine:
        windowed, bits, _, _ = CONFIGS[config]
        return Engine(self.loaded, kv_bits=bits, prefill_chunk=self.a.chunk, speculation=speculation,
                      archive_bytes=(1 << 40) if archive else 0, window=self.window if windowed else None,
                      compute=self.options(config))

    def drop_archive(self) -> None:
        shutil.rmtree(self.home / "archive", ignore_errors=True)


def idle(eng: Engine, timeout_s: float = 600) -> None:
    if not eng.wait_idle(timeout_s):  # `Engine.wait_idle`: a worker that never gets there fails the run
        raise RuntimeError(f"the engine was not idle after {timeout_s:.0f} s")


def ask(eng: Engine, segments: list, max_tokens: int) -> dict[str, Any]:
    """One request, started with the engine idle (as after a user read an answer): its metrics, forwards and decode
    steps (`request_profile.ForwardLog`), ids, tokens' spacing, MLX's memory held (active, cached) and its peak."""
    idle(eng)
    held = [round(n / 2**30, 2) for n in (mx.get_active_memory(), mx.get_cache_memory())]
    before = request_profile.step_counts(eng)
    mx.reset_peak_memory()
    with request_profile.ForwardLog() as log:
        handle = eng.submit(Request(segments=segments, max_tokens=max_tokens))
        ids, arrivals = [], []
        for e in handle:
            if isinstance(e, TokenEvent):
                ids += e.token_ids
                arrivals.append((time.perf_counter(), len(e.token_ids)))
        done = handle.result()
    if done.finish_reason == "error":
        raise RuntimeError(f"request failed: {done.error}") from done.error
    m = done.metrics
    return dict(prompt=m.prompt_tokens, restored=m.cached_tokens, recomputed=m.recomputed_tokens,
                ttft_s=round(m.ttft_s, 4), prefill_s=round(m.prefill_s, 4), prefill_tps=round(m.prefill_tps, 1),
                decode_tokens=m.decode_tokens, decode_tps=round(m.decode_tps, 2), drafted=m.drafted_tokens,
                accepted=m.accepted_tokens, miss=m.miss_reason, peak_gib=round(mx.get_peak_memory() / 2**30, 2),
                restore_s=log.restore_s, forwards=log.forwards, records=log.records, detaches=log.detaches,
                archive_copies=log.archive_copies, token_gaps=request_profile.token_gaps(arrivals),
                decode_host_ms=request_profile.decode_host(log.decode_steps), ids=ids, held_gib=held,
                step_traces_fallbacks=[b - a for a, b in zip(before, request_profile.step_counts(eng))])


RAW_VARIANT = (False, False, "cores")
"""The kernels argument both raw steps pass to `bench.gpu_step.decode_steps` (its scope asks for none of its own)."""


def raw_steps(run: Run, length: int, config: str, steps: int = 16) -> None:
    """The same decode step outside the engine (bench/gpu_step.py's pipelined loop over a window cache of random
    rows, disabled for dense configurations; the path `config`'s engine chose), in this process after its asks, at
    the follow-up's key count if any (before the 21st session at `length`): what the engine adds to a step."""
    from bench.gpu_step import decode_steps
    from engine.step_measure import filled_cache

    asks = [r["prompt"] for r in run.result.get("rows", []) if (r["config"], r["step"]) == (config, "follow-up")]
    length = asks[0] if asks else length
    path = choose(run.model, run.options(config))  # as the engine chooses it
    policy = run.window if CONFIGS[config][0] else WindowPolicy(enabled=False)
    cache = filled_cache(run.model, policy, CONFIGS[config][1], length)
    decode_steps(path, cache, 2, RAW_VARIANT, "sync", attempts=1)  # the buffers grow once, untimed
    times = decode_steps(path, cache, steps, RAW_VARIANT, "pipelined", attempts=3)
    add_raw_step(run, length, config, "a filled cache", times)
    del cache
    free()


def engine_cache_steps(run: Run, eng: Engine, config: str, steps: int = 16) -> None:
    """The raw step's loop over the idle engine's own cache and path, its archive writes paused as during a request,
    on this thread: against the raw step over a filled cache and the engine's asks, whether what the engine adds to
    a token comes with its cache or with its request path (docs/benchmarks.md, *GPU engine*)."""
    from bench.gpu_step import decode_steps

    idle(eng)
    with eng.prefix.request_scope():  # (decode_steps puts the cache's offset back after each run)
        times = decode_steps(eng.compute, eng.prefix.cache, steps, RAW_VARIANT, "pipelined", attempts=3)
    add_raw_step(run, eng.prefix.cache[0].offset, config, "the engine's cache, writes paused", times)


def add_raw_step(run: Run, length: int, config: str, over: str, times: Any) -> None:
    run.result.setdefault("raw_steps", []).append(dict(
        length=length, config=config, over=over, step_ms=round(times.seconds * 1e3, 2),
        host_ms=round(times.host * 1e3, 2), python_ms=round(times.python * 1e3, 2),
        bound_ms=round(1e3 / decode_bound(run, length, CONFIGS[config][1]), 2)))
    print(f"raw step {config} at {length} over {over}: {run.result['raw_steps'][-1]}", flush=True)


def close(eng: Engine) -> float:
    """Close `eng` (its archive writes finish); the seconds that took. Drop the caller's reference, then `free`."""
    start = time.perf_counter()
    eng.close()
    return time.perf_counter() - start


def free() -> None:
    """Give closed engines' memory back before the next one is built."""
    gc.collect()
    mx.clear_cache()


def warm_up(run: Run, config: str, length: int) -> None:
    """An untimed prefill (no archive) over enough tokens for windowed chunks: CUDA compiles the prefill's and decode's
    kernels here. A speculative round's few-row kernels are left to the first restart's first rounds, as a new process
    meets them (docs/benchmarks.md, *GPU engine*, twenty-fifth session)."""
    w = run.window
    repo = synthetic_repository(min(length, w.global_tokens + w.window_tokens + 3 * run.a.chunk + w.dense_tail),
                                run.model.args.vocab_size, seed=99)
    eng = run.engine(config, archive=False)
    ask(eng, repo.prompt(98), 2)
    close(eng)
    del eng
    free()


def prefill_tflops(run: Run, row: dict[str, Any], segments: list, windowed: bool) -> float:
    """Achieved TFLOP/s of a cold prefill: linear layers plus the attention actually computed (uniform chunks)."""
    args, n = run.model.args, row["recomputed"]
    policy = run.window if windowed else WindowPolicy(enabled=False)
    attention = attention_flops(n, run.a.chunk, policy, policy.dense_from(segments))
    flops = n * run.result["linear_flops_per_token"] + attention * args.num_attention_heads * args.head_dim \
        * args.num_hidden_layers
    return round(flops / row["prefill_s"] / 1e12, 1)


def decode_bound(run: Run, context: int, bits: int) -> float:
    """Decode tok/s the copy bandwidth allows for the bytes one step reads at `context`."""
    per_token = gpu_bounds.decode_bytes_per_token(run.model, context, bits)
    return round(run.result["bounds"]["copy_gbs"] * 1e9 / per_token, 2)


def record(run: Run, length: int, config: str, step: str, row: dict[str, Any], **extra: Any) -> dict[str, Any]:
    bits = CONFIGS[config][1]
    row = {k: v for k, v in row.items() if k != "ids"}
    row.update(length=length, config=config, step=step, decode_bound_tps=decode_bound(run, row["prompt"], bits),
               **extra)
    run.add(row)
    return row


def whole_loop(run: Run, length: int, config: str) -> None:
    """Cold ask, follow-up, edit then ask, restart then ask (prompt lookup), one configuration."""
    repo = synthetic_repository(length, run.model.args.vocab_size)
    edited, key = repo.edited()
    eng = run.engine(config, archive=run.a.archive == "on")
    if "linear_mode" not in run.result:
        run.result["linear_mode"] = eng.compute.describe()["linear"]
        run.result["decode_kernels"] = eng.compute.describe()["kernels"]
    cold_prompt = repo.prompt(1)
    cold = ask(eng, cold_prompt, run.a.decode)
    record(run, length, config, "cold ask", cold, tflops=prefill_tflops(run, cold, cold_prompt, True))
    with request_profile.profiled() if run.a.profile else contextlib.nullcontext([]) as profiles:
        follow_up = ask(eng, repo.prompt(2), run.a.decode)
        edit = ask(eng, edited.prompt(3), run.a.decode)
    tops = [{"profile": request_profile.top(p)} for p in profiles] + [{}, {}]  # none when not profiled
    record(run, length, config, "follow-up", follow_up, **tops[0])
    record(run, length, config, "edit + ask", edit, edited_file=key,
           edited_tokens=len(edited.hot[-1].token_ids), **tops[1])
    edit_warm_ask(run, eng, edited, length, config)
    if run.a.raw_step and CONFIGS[config][0]:
        engine_cache_steps(run, eng, config)
    flush_s = close(eng)
    del eng
    free()
    if run.a.archive == "off":
        return
    dropped = gpu_bounds.drop_page_cache()
    start = time.perf_counter()
    eng = run.engine(config, speculation="lookup")
    start_s = time.perf_counter() - start
    restart = ask(eng, edited.prompt(4), run.a.decode)
    archive_bytes = eng.stats()["cache"]["archive_bytes"]
    read = restart["restored"] * gpu_bounds.kv_bytes_per_token(run.model.args, CONFIGS[config][1])
    disk = run.result["bounds"]["disk"]
    record(run, length, config, "restart + ask (lookup)", restart, engine_start_s=round(start_s, 3),
           close_flush_s=round(flush_s, 2), page_cache_dropped=dropped, archive_bytes=archive_bytes,
           restored_bytes=read, disk_bound_s=round(read / (disk["cold_gbs"] * 1e9), 3),
           cached_bound_s=round(read / (disk["cached_gbs"] * 1e9), 3), plain_decode_tps=edit["decode_tps"])
    close(eng)
    del eng
    free()
    run.drop_archive()


def edit_warm_ask(run: Run, eng: Engine, edited: Any, length: int, config: str) -> None:
    """The editor's flow: the file edited again, warm-up prefills the new layout (as the server's does once
    the user pauses), then an ask: what a question costs once the edit is warm."""
    again, key = edited.edited(seed=8)
    idle(eng)
    start = time.perf_counter()
    warm = eng.submit(Request(segments=again.prefix, max_tokens=0, priority=Priority.BACKGROUND)).result()
    warm_s = time.perf_counter() - start
    if warm.finish_reason == "error":
        raise RuntimeError(f"warm-up failed: {warm.error}") from warm.error
    record(run, length, config, "edit, warm-up, ask", ask(eng, again.prompt(5), run.a.decode), edited_file=key,
           edited_tokens=len(again.hot[-1].token_ids), warmup_s=round(warm_s, 3),
           warmup_recomputed=warm.metrics.recomputed_tokens)


def cold_only(run: Run, length: int, config: str) -> None:
    """A cold ask and its decode, one configuration."""
    repo = synthetic_repository(length, run.model.args.vocab_size)
    eng = run.engine(config, archive=run.a.archive == "on")
    prompt = repo.prompt(1)
    cold = ask(eng, prompt, run.a.decode)
    record(run, length, config, "cold ask", cold, tflops=prefill_tflops(run, cold, prompt, CONFIGS[config][0]),
           linear=eng.compute.describe()["linear"]["mode"])
    close(eng)
    del eng
    free()
    run.drop_archive()


def measure_bounds(run: Run) -> None:
    small = run.a.small
    run.result["bounds"] = dict(matmul_tflops=round(gpu_bounds.matmul_tflops(512 if small else 8192), 3),
                                copy_gbs=round(gpu_bounds.copy_bandwidth(0.25 if small else 4.0), 1),
                                disk=gpu_bounds.disk_read(run.home / "probe", run.a.disk_gib))
    run.result["linear_flops_per_token"] = linear_flops_per_token(run.model)
    run.result["weight_bytes_per_token"] = gpu_bounds.weight_bytes_per_token(run.model)
    print(json.dumps(run.result["bounds"]), file=sys.stderr, flush=True)
    run.save()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    run = Run(a)
    measure_bounds(run)
    run.result["linear_agreement"] = linear_agreement(run.shape, run.shape_name, a.chunk, 2 if a.small else 4,
                                                      512 if a.small else 1024, 32)
    free()
    run.save()
    for length in run.lengths:
        for config in [c for c in a.configs.split(",") if c]:
            try:
                warm_up(run, config, length)
                (whole_loop if CONFIGS[config][2] else cold_only)(run, length, config)
                if a.raw_step:
                    raw_steps(run, length, config)
            except Exception as err:  # noqa: BLE001 - one configuration's failure must not lose the others
                run.result.setdefault("errors", []).append(dict(length=length, config=config, error=repr(err)))
                print(f"{length} {config} failed: {err!r}", file=sys.stderr, flush=True)
                free()
                run.drop_archive()
    run.result["goals"] = goals(run.result)
    run.save()
    print(table(run.result))
    print(f"\nwrote {run.out}", file=sys.stderr)
    if not a.home:
        shutil.rmtree(run.home, ignore_errors=True)
    return run.result


if __name__ == "__main__":
    main()
