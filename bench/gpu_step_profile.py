"""The device's own time in one decode step, kernel by kernel, read by Nsight Compute.

`bench/gpu_step.py` and the engine's decode log time a step from the host: building it, submitting it
(`mx.async_eval`) and waiting for its token. They cannot say whether the device or the host sets the
pace, because MLX's submitting waits for the device too: MLX's CUDA backend closes a CUDA graph
after 100 operations or 1,000 MB of inputs on Hopper, and `mx.async_eval` blocks while more than ten
closed graphs are running (MLX 0.32: ``get_graph_limits`` in its CUDA device code, ``MAX_ACTIVE_TASKS``
in its transforms). At 128k keys one layer's weights and KV buffers pass 500 MB, so by that rule a step is
32-64 graphs (derived from the sizes, not counted) and the host can run at most a fraction of a step ahead.

This script runs the engine's decode step (the path `--variant` names, over the Qwen3-32B-shaped
random model and a window cache of `--length` rows, as `bench/gpu_step.py` builds them), a few steps
untimed, then `--steps` steps one at a time between `cuProfilerStart` and `cuProfilerStop`, so that
``ncu --profile-from-start off`` times every kernel of those steps and nothing else. `--report`
reads ncu's CSV and prints the device milliseconds per step by kernel (our kernels by their name,
MLX's by their function) and their sum, to set beside the bytes a step reads (the profiling run prints
them; at the copy bandwidth `bench/gpu_engine.py` measures, about 3,550 GB/s, that is the step's bound).

    # on the lent H200 (device tool, carry [".gpu"]); one process per width:
    bash .gpu/install.sh > /dev/null 2>&1
    ncu --profile-from-start off --clock-control none --graph-profiling node --metrics gpu__time_duration.sum \
        --csv --print-units base --log-file $OUT/ncu-8.csv python3 bench/gpu_step_profile.py --bits 8
    python3 bench/gpu_step_profile.py --report $OUT/ncu-8.csv --steps 2 --out $OUT/gpu_step_profile-8.json
    python bench/gpu_step_profile.py --shape tiny --length 1024 --bits 8 --variant ours   # CPU smoke run (no profiler)

With ``--forward ROWS`` it profiles forwards of ROWS rows at the cache's end instead (an edit + ask's hot copy,
1,037 rows, or its question, 45), as the engine's prefill runs them. Before the profiled ones it prints the
wall time of a forward at 64 keys fewer (new attention shapes, every kernel already built) and of that forward
twice more (warm): the first minus the others is what a new shape costs (MLX's cuDNN plan per shape).
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
"""ncu's time units, as milliseconds."""


def kernel_group(name: str) -> str:
    """A kernel's name without what varies between instances: our kernels' code digest
    (`engine.cuda_backend`: ``name_<hex>``), C++ template arguments and parameter lists."""
    name = re.sub(r"^void\s+", "", name.strip())
    name = re.split(r"[<(]", name, maxsplit=1)[0]
    return re.sub(r"_[0-9a-f]{8,}$", "", name)


def device_ms(rows: Iterable[dict[str, str]]) -> dict[str, tuple[int, float]]:
    """From ncu's CSV rows (``--csv``, one row per kernel and metric), the launches and milliseconds
    of ``gpu__time_duration.sum`` per `kernel_group`."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond")
        if unit not in UNITS:
            raise ValueError(f"unknown time unit {unit!r} (run ncu with --print-units base)")
        group = totals[kernel_group(row["Kernel Name"])]
        group[0] += 1
        group[1] += float(row["Metric Value"].replace(",", "")) * UNITS[unit]
    return {name: (int(n), ms) for name, (n, ms) in totals.items()}


def read_ncu_csv(path: str) -> list[dict[str, str]]:
    """ncu's CSV log: the lines from the header (the first that starts with ``"ID"``) on; ncu's own
    ``==PROF==`` lines and the program's output before it are skipped."""
    lines = Path(path).read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError(f"{path}: no ncu CSV header (was ncu run with --csv?)")
    return list(csv.DictReader(line for line in lines[start:] if not line.startswith("==")))


def report(path: str, steps: int) -> dict[str, Any]:
    from bench._common import markdown_table

    per_group = device_ms(read_ncu_csv(path))
    rows = sorted(((name, n / steps, ms / steps) for name, (n, ms) in per_group.items()), key=lambda r: -r[2])
    total = sum(ms for _, _, ms in rows)
    print(markdown_table(["kernel", "launches a step", "device ms a step", "share"],
                         [[name, f"{n:g}", f"{ms:.3f}", f"{ms / total:.0%}"] for name, n, ms in rows]))
    print(f"\ndevice ms a step: {total:.3f} over {sum(n for _, n, _ in rows):g} launches")
    return {"csv": path, "steps": steps, "device_ms_per_step": round(total, 4),
            "kernels": [{"kernel": name, "launches": n, "ms": round(ms, 4)} for name, n, ms in rows]}


def profiler(call: str) -> bool:
    """cuProfilerStart or cuProfilerStop through the CUDA driver, in the device's primary context (MLX's,
    made current on this thread if it is not); False where there is no driver or the call fails."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    context = ctypes.c_void_p()
    if driver.cuCtxGetCurrent(ctypes.byref(context)) != 0:
        return False
    if not context.value and (driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) != 0
                              or driver.cuCtxSetCurrent(context) != 0):
        return False
    return getattr(driver, call)() == 0


def _forwards(a: argparse.Namespace) -> tuple[Any, Any, float, list[float]]:
    """`--forward`: forwards of `a.forward` rows at the end of a dense cache of `a.length` rows, as an edit + ask's
    prefill runs them (run q's choices: dequantized linears from 128 rows, our chunk attentions up to 48 rows),
    a few untimed, then `a.steps` between the profiler's start and stop; the offset put back before each."""
    import time

    import mlx.core as mx

    from bench.gpu_step import step_model
    from engine.decode_choice import DecodeKernels
    from engine.linear_mode import LinearMode
    from engine.step_measure import filled_cache
    from engine.window import set_dense_from

    model, policy, path = step_model(a.shape)
    path.linear = LinearMode("dequantized", min_rows=128)
    ours = mx.default_device() == mx.gpu
    path.kernels = DecodeKernels(qmv=ours, attention_chunk=ours, attention_chunk_q8=ours, source="bench")
    cache = filled_cache(model, policy, a.bits, a.length)
    set_dense_from(cache, a.length)
    ids = mx.array([[7] * a.forward], dtype=mx.uint32)

    def run(n: int, offset: int = a.length) -> float:
        set_dense_from(cache, offset)  # the forward dense, as an edit + ask's at the prompt's end
        began = time.perf_counter()
        for _ in range(n):
            for c in cache:
                c.offset = offset
            mx.eval(path.forward(ids, cache, logits="last"))
        return time.perf_counter() - began
    run(3)
    # The same forward at 64 keys fewer: new attention shapes (MLX builds a cuDNN plan for each, its source) with
    # every kernel already built, then those shapes again (warm): what a new shape costs the edit + ask's forward.
    shapes_ms = [round(run(1, a.length - 64) * 1e3, 2) for _ in range(3)]
    print({"forward_rows": a.forward, "kv_bits": a.bits, "ms_new_shape_then_warm": shapes_ms}, flush=True)
    started = profiler("cuProfilerStart")
    return started, model, run(a.steps), shapes_ms


def profile(a: argparse.Namespace) -> dict[str, Any]:
    import time

    import mlx.core as mx

    from bench.gpu_step import decode_steps, step_model, step_paths, switches
    from engine import mlx_env
    from engine.step_measure import filled_cache

    if a.forward:
        started, model, seconds, shapes_ms = _forwards(a)
        stopped = profiler("cuProfilerStop")
        result = {"forward_rows": a.forward, "kv_bits": a.bits, "length": a.length, "forwards": a.steps,
                  "ms_per_forward_profiled": round(seconds / a.steps * 1e3, 3), "profiler": started and stopped,
                  "ms_new_shape_then_warm": shapes_ms, "mlx": mx.__version__, "device": str(mx.default_device()),
                  "mlx_env": mlx_env.current()}
        print(result, flush=True)
        return result
    model, policy, path = step_model(a.shape)
    ours = mx.default_device() == mx.gpu
    if a.variant != "ours" and not ours:
        raise SystemExit(f"--variant {a.variant} runs our CUDA kernels: only on MLX's CUDA backend (use ours)")
    step_path = step_paths(model, path, a.attention)[a.variant]
    kernels = switches(a.bits, ours, a.attention)
    write = ours and a.bits == 8
    cache = filled_cache(model, policy, a.bits, a.length)
    decode_steps(step_path, cache, 3, kernels, "sync", attempts=1, kv_write=write)  # traces, compiles, grows
    started = profiler("cuProfilerStart")
    began = time.perf_counter()
    decode_steps(step_path, cache, a.steps - 1, kernels, "sync", attempts=1, kv_write=write)  # a.steps steps
    seconds = time.perf_counter() - began
    stopped = profiler("cuProfilerStop")
    if ours and not (started and stopped):
        raise SystemExit("cuProfilerStart/Stop failed: ncu --profile-from-start off would have timed nothing")
    from bench.gpu_bounds import decode_bytes_per_token

    result = {"variant": a.variant, "attention": a.attention, "kv_bits": a.bits, "length": a.length, "steps": a.steps,
              "bytes_per_step": decode_bytes_per_token(model, a.length, a.bits),
              "ms_per_step_profiled": round(seconds / a.steps * 1e3, 3), "profiler": started and stopped,
              "mlx": mx.__version__, "device": str(mx.default_device()), "mlx_env": mlx_env.current()}
    print(result, flush=True)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, choices=(8, 16), default=8)
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=2, help="steps profiled (also what --report divides by)")
    ap.add_argument("--variant", choices=("ours", "ours+fused", "ours+traced", "ours+traced+fused"),
                    default="ours+traced+fused",
                    help="the step's path, as bench/gpu_step.py's rows name them")
    ap.add_argument("--shape", default="qwen3-32b", help="bench/prefill.py's shape (tiny: a CPU smoke run)")
    ap.add_argument("--attention", choices=("mma", "staged", "transposed"), default="mma",
                    help="our 8-bit attention on tensor cores: engine/cuda_attention_mma.py, _staged.py or "
                         "_transposed.py")
    ap.add_argument("--forward", type=int, default=0,
                    help="profile --steps forwards of this many rows at the cache's end instead (an edit + ask's)")
    ap.add_argument("--report", default=None, help="ncu's CSV log to read instead of running")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.steps < 2:
        ap.error("--steps must be at least 2 (bench/gpu_step.py's decode_steps times steps after the first)")
    if a.report:
        result = report(a.report, a.steps)
    else:
        from engine import mlx_env

        mlx_env.apply()
        result = profile(a)
    if a.out:
        from bench._common import save_json

        save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
