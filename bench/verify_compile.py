"""Part of what a first speculative round compiles: our few-row linears' kernels for a Qwen3-32B-shaped block, timed
through NVIDIA's runtime compiler on a machine without a GPU.

`engine.cuda_qmv` compiles its kernels per row bucket (1, 2, 4, 8) at first use. Decode uses bucket 1; a
lookup round verifies 2-8 tokens, so the first one builds a bucket's four kernels (the block's q, k and v in
one launch, its gate and up with the activation, the o and down projections). With 8-bit KV a restart's first
verify round waited 8-12 s at 131,072 tokens in every engine run that recorded it, and 6.5 s at 8,192 in run bb
(docs/benchmarks.md, *GPU engine*, twenty-fourth and twenty-fifth sessions). These kernels are one part of that,
not all: forwards of the three buckets ahead of time left a 1.3-1.6 s wait. This script records the kernels a
forward of `rows` rows would build (MLX's kernel call replaced by `tests/engine/cuda_compile.py`'s recorder, named
as such: MLX's CUDA backend cannot run here) and times NVRTC compiling each for the H200 (sm_90) on this machine.
Not timed here: MLX compiles with its own, larger header and then loads the result through the driver, on the GPU
host's CPU.

    python bench/verify_compile.py                # buckets 1, 2, 4, 8; table and JSON under bench/results/
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from bench._common import machine, markdown_table, write_json  # noqa: E402
from engine import cuda_qmv  # noqa: E402
from tests.engine.cuda_compile import compile_errors, record_kernels  # noqa: E402

HIDDEN, Q, KV, MLP = 5120, 8192, 1024, 25600  # Qwen3-32B
FACTORIES = (cuda_qmv._kernel, cuda_qmv._three_kernel, cuda_qmv._glu_kernel)


def linear(k: int, n: int) -> nn.QuantizedLinear:
    layer = nn.QuantizedLinear(k, n, bias=False, group_size=64, bits=4)
    layer.set_dtype(mx.bfloat16)
    return layer


def block_sources(rows: int) -> dict[str, str]:
    """The kernel sources one block's linears build for a forward of `rows` rows (by label)."""
    recorder = record_kernels(FACTORIES)
    x = mx.zeros((1, rows, HIDDEN), dtype=mx.bfloat16)
    cuda_qmv.three(x, (linear(HIDDEN, Q), linear(HIDDEN, KV), linear(HIDDEN, KV)))
    gate = linear(HIDDEN, MLP)
    cuda_qmv.glu(x, gate, gate)
    for k in (Q, MLP):  # o and down projections
        out = linear(k, HIDDEN)
        cuda_qmv.qmv(mx.zeros((1, rows, k), dtype=mx.bfloat16), out.weight, out.scales, out.biases,
                     bits=4, group_size=64)
    return recorder.sources()


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8", help="forward sizes (each its own bucket)")
    a = ap.parse_args(argv)
    results = []
    for rows in (int(r) for r in a.rows.split(",")):
        seconds = []
        for label, source in block_sources(rows).items():
            start = time.perf_counter()
            problem = compile_errors(source, f"{label}.cu")
            seconds.append(time.perf_counter() - start)
            if problem:
                raise RuntimeError(f"{label} does not compile:\n{problem}")
        results.append(dict(rows=rows, kernels=len(seconds), nvrtc_s=round(sum(seconds), 2),
                            slowest_s=round(max(seconds), 2)))
    base = results[0]["nvrtc_s"]
    print(markdown_table(["rows", "kernels", "NVRTC s", "slowest s", f"vs {results[0]['rows']} row(s)"],
                         [[r["rows"], r["kernels"], r["nvrtc_s"], r["slowest_s"], f"{r['nvrtc_s'] / base:.1f}x"]
                          for r in results]))
    print(f"wrote {write_json('verify_compile', {'machine': machine(), 'results': results})}")
    return results


if __name__ == "__main__":
    main()
