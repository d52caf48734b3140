"""One-query decode attention at long context, kernel by kernel, for Nsight Compute's full sections.

`bench/gpu_attention.py --sections decode` times our 8-bit kernels against MLX's bf16 attention; this script
says why they run at the speed they do. It builds one 8-bit cache and one bf16 cache of `--length` keys (8 KV
heads of dim 128, 64 query heads, the buffers grown as a live cache grows them, so MLX takes cuDNN's decode
path), runs every kernel once untimed, then `--calls` calls of each of `--kernels` between `cuProfilerStart`
and `cuProfilerStop`, so that ``ncu --profile-from-start off`` reads those launches and nothing else: each of
our kernels (its partial attention and its merge) and MLX's bf16 attention.

    # device tool, carry [".gpu"]:
    bash .gpu/install.sh > /dev/null 2>&1
    ncu --profile-from-start off --clock-control none --set full --csv --page details \
        --log-file $OUT/ncu-attention.csv python3 bench/gpu_attention_profile.py
    python3 bench/gpu_attention_profile.py --report $OUT/ncu-attention.csv
    python bench/gpu_attention_profile.py --length 1024 --kernels ""   # CPU smoke run: MLX only, no profiler
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_step_profile import kernel_group, profiler, read_ncu_csv  # noqa: E402

HEADS, KV_HEADS, DIM = 64, 8, 128
METRICS = ("Duration", "DRAM Throughput", "Memory Throughput", "L2 Hit Rate", "Achieved Occupancy",
           "Theoretical Occupancy", "Registers Per Thread", "Issue Slots Busy", "No Eligible",
           "Warp Cycles Per Issued Instruction", "Executed Ipc Active", "Grid Size", "Block Size", "Waves Per SM")
"""The rows of ncu's details page the report prints, per kernel (the CSV keeps every section's rows)."""


def run(a: argparse.Namespace) -> dict[str, Any]:
    from engine import mlx_env

    mlx_env.apply()
    import mlx.core as mx

    from bench.gpu_attention import buffer_positions
    from engine import cuda_attention

    n, scale = a.length, DIM ** -0.5
    cap = buffer_positions(n + 1)
    k = mx.random.normal((1, KV_HEADS, cap, DIM), key=mx.random.key(10)).astype(mx.bfloat16)
    v = mx.random.normal((1, KV_HEADS, cap, DIM), key=mx.random.key(11)).astype(mx.bfloat16)
    kq, vq = mx.quantize(k, group_size=64, bits=8), mx.quantize(v, group_size=64, bits=8)
    q = mx.random.normal((1, HEADS, 1, DIM), key=mx.random.key(3)).astype(mx.bfloat16) * 3
    mx.eval(k, v, kq, vq, q)

    calls = {kernel: (lambda kernel=kernel: cuda_attention.decode_attention(q, kq, vq, n, scale, 64, kernel))
             for kernel in a.kernels.split(",") if kernel}
    calls["mlx_bf16"] = lambda: mx.fast.scaled_dot_product_attention(q, k[..., :n, :], v[..., :n, :], scale=scale)
    for call in calls.values():  # compiles our kernels and builds cuDNN's plan outside the profiled range
        mx.eval(call())
    started = profiler("cuProfilerStart")
    for name, call in calls.items():
        for _ in range(a.calls):
            mx.eval(call())
    stopped = profiler("cuProfilerStop")
    if mx.default_device() == mx.gpu and not (started and stopped):
        raise SystemExit("cuProfilerStart/Stop failed: ncu --profile-from-start off would have read nothing")
    result = {"length": n, "calls": a.calls, "kernels": list(calls), "bytes_8bit": sum(x[..., :n, :].nbytes for x in
              (*kq, *vq)), "bytes_bf16": 2 * k[..., :n, :].nbytes, "mlx": mx.__version__,
              "device": str(mx.default_device()), "profiler": started and stopped}
    print(result, flush=True)
    return result


def report(path: str) -> dict[str, Any]:
    """Per kernel (grouped by name), the mean of each of `METRICS` over its profiled launches."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    units: dict[str, str] = {}
    for row in read_ncu_csv(path):
        metric = row.get("Metric Name", "")
        if metric not in METRICS:
            continue
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        values[kernel_group(row["Kernel Name"])][metric].append(value)
        units[metric] = row.get("Metric Unit", "")
    table = {kernel: {m: round(sum(v) / len(v), 3) for m, v in metrics.items()} for kernel, metrics in values.items()}
    for kernel, metrics in table.items():
        print(f"\n{kernel}")
        for metric in METRICS:
            if metric in metrics:
                print(f"  {metric:40s} {metrics[metric]:>12g} {units.get(metric, '')}")
    return {"csv": path, "units": units, "kernels": table}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=131072)
    ap.add_argument("--calls", type=int, default=2, help="profiled calls of each kernel")
    ap.add_argument("--kernels", default="staged,transposed", help="engine.cuda_attention.decode_attention's kernels")
    ap.add_argument("--report", default=None, help="ncu's CSV log (--page details) to read instead of running")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    result = report(a.report) if a.report else run(a)
    if a.out:
        from bench._common import save_json

        save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
