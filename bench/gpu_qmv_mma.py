"""An experiment before the engine: the decode product of a 4-bit linear on tensor cores, against our CUDA-core
kernels (`engine.cuda_qmv`, `engine.cuda_qmv_split`) on Qwen3-32B's linear shapes, on the GPU.

In profile e (docs/benchmarks.md, twelfth session) the 8-bit step's linears took 7.9 ms for 18 GB, 2.3 TB/s,
and `cuda_qmv`'s loop spends about 0.13 warp instructions a weight, compiled for sm_90 (`scripts/sass_loops.py`:
1,052 instructions for four steps of 2 rows x 32 lanes x 32 weights). An estimate, not a measurement: over
about 32.8 billion weights a step that is 4.3 billion warp instructions, about 4 ms of issue on 132
multiprocessors x 4 schedulers at an assumed 1.98 GHz, one instruction a cycle each. Here the weights go through ``mma.sync`` m16n8k16 in bf16:

- a block of eight warps takes 16 output rows, each warp a run of K in whole groups of 64, their sums
  meeting in shared memory;
- lane 4g + c takes words 2c and 2c + 1 of a group of rows g and g + 8 (an 8-byte load each) and makes each
  pair of 4-bit values (j, j + 4) of a word a bf16 pair 128 + q with one logic operation,
  ``(w >> 4j) & 0x000F000F | 0x43004300``; the products' k runs over those pairs, and the input row is
  permuted to match (two byte permutes a product);
- the input row is every column of B (one row: the other seven columns repeat it), so every lane's
  accumulator holds its rows' sums; a second product against ones gives the group's sum of x, and
  ``s * acc + (b - 128 s) * sum(x)`` applies the group's scale and bias.

Compiled for sm_90 its loop is 306 instructions for four groups of 16 rows, 0.075 warp instructions a weight
(`scripts/sass_loops.py`'s count; 64 registers). A NumPy transliteration of a block's fragments gave the
dequantized product exactly. Whether fewer instructions turn into bandwidth is what this measures: per shape, one call's time over `DISTINCT` matrices in turn (past the 50 MB L2), the bytes read per
second, and the relative error of each kernel against a float32 product of the dequantized weights. One input
row, bf16, groups of 64, K a multiple of 512, N of 16.

    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_qmv_mma.py --out $OUT/gpu_qmv_mma.json
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()  # as the engine's start-up step does, before MLX starts

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from bench.gpu_attention import median_ms, rel_err  # noqa: E402
from engine import cuda_backend, cuda_qmv, cuda_qmv_split  # noqa: E402
from engine.cuda_attention_fragments import HEADER  # noqa: E402

SHAPES = {"q": (8192, 5120), "o": (5120, 8192), "gate": (25600, 5120), "down": (5120, 25600)}
"""Qwen3-32B's linears, (N rows, K): the q projection, o, the MLP's gate (up alike) and down."""
CALLS = 64
DISTINCT_BYTES = 160e6
"""Matrices of a shape taken in turn: at least this many bytes of them, so the calls read memory, not the L2."""

SOURCE = r"""
  // A block: 16 output rows from row0, 8 warps each a run of the groups of 64; lane = 4 g + c.
  constexpr int GROUPS = K / 64, WGROUPS = GROUPS / 8;
  constexpr uint32_t ONE = 0x3F803F80u;    // bf16 (1, 1)
  // bf16 (128, 128) = 0x43004300: 128 + q where a 4-bit q fills the low mantissa bits
  const int warp = threadIdx.y, lane = threadIdx.x, g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.y * 16;
  const uint2* wa = reinterpret_cast<const uint2*>(w) + (size_t)(row0 + g) * (K / 16);  // 4 uint2 a group
  const uint2* wb = reinterpret_cast<const uint2*>(w) + (size_t)(row0 + g + 8) * (K / 16);
  const uint4* xv = reinterpret_cast<const uint4*>(x);  // 8 values a uint4, 8 a group
  // (v & 0x000F000F) | 0x43004300 in one logic operation: both constants in registers (an instruction takes one
  // immediate)
  uint32_t low_nibbles, magic;
  asm("mov.b32 %0, 0x000F000F;" : "=r"(low_nibbles));
  asm("mov.b32 %0, 0x43004300;" : "=r"(magic));
  auto pair = [&](uint32_t v) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(v), "r"(low_nibbles), "r"(magic));
    return d;
  };
  float y0 = 0.f, y1 = 0.f;  // rows g and g + 8
#pragma unroll 4
  for (int i = 0; i < WGROUPS; ++i) {
    const int grp = warp * WGROUPS + i;
    const uint2 a = wa[grp * 4 + c], b = wb[grp * 4 + c];  // words 2c, 2c + 1 of the group
    const uint4 xs[2] = {xv[grp * 8 + 2 * c], xv[grp * 8 + 2 * c + 1]};  // their 16 inputs
    float acc[4] = {0.f, 0.f, 0.f, 0.f}, sx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // word 2c + (m >> 1), value pairs (j, j + 4) and (j + 1, j + 5), j = 2 (m & 1)
      const uint32_t ra = m >> 1 ? a.y : a.x, rb = m >> 1 ? b.y : b.x;
      const uint4 xw = xs[m >> 1];
      const int j = 2 * (m & 1);
      const uint32_t lo = j ? xw.y : xw.x, hi = j ? xw.w : xw.z;  // inputs (j, j + 1) and (j + 4, j + 5)
      const uint32_t b0 = codectx::prmt(lo, hi, 0x5410u), b1 = codectx::prmt(lo, hi, 0x7632u);
      codectx::mma16816(acc, pair(ra >> (4 * j)), pair(rb >> (4 * j)), pair(ra >> (4 * j + 4)),
                        pair(rb >> (4 * j + 4)), b0, b1);
      codectx::mma16816(sx, ONE, ONE, ONE, ONE, b0, b1);
    }
    const float s0 = static_cast<float>(scales[(size_t)(row0 + g) * GROUPS + grp]);
    const float s1 = static_cast<float>(scales[(size_t)(row0 + g + 8) * GROUPS + grp]);
    const float z0 = static_cast<float>(biases[(size_t)(row0 + g) * GROUPS + grp]);
    const float z1 = static_cast<float>(biases[(size_t)(row0 + g + 8) * GROUPS + grp]);
    y0 += s0 * acc[0] + (z0 - 128.f * s0) * sx[0];
    y1 += s1 * acc[2] + (z1 - 128.f * s1) * sx[2];
  }
  __shared__ float partial[8][16];
  if (c == 0) {
    partial[warp][g] = y0;
    partial[warp][g + 8] = y1;
  }
  __syncthreads();
  if (warp == 0 && lane < 16) {
    float total = 0.f;
#pragma unroll
    for (int v = 0; v < 8; ++v) total += partial[v][lane];
    y[row0 + lane] = static_cast<T>(total);
  }
"""


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv_mma", SOURCE, HEADER, input_names=["x", "w", "scales", "biases"],
                               output_names=["y"])


def qmv_mma(x: mx.array, linear: nn.QuantizedLinear) -> mx.array:
    """``linear(x)`` for one bf16 row through the tensor-core kernel (4 bits, groups of 64, K % 512, N % 16)."""
    n, k = linear.weight.shape[0], x.shape[-1]
    if (linear.bits, linear.group_size, x.dtype, k % 512, n % 16, x.size // k) != (4, 64, mx.bfloat16, 0, 0, 1):
        raise ValueError(f"not a shape the experiment takes: {n} x {k}, {linear.bits} bits, {x.dtype}")
    return _kernel()(inputs=[x, linear.weight, linear.scales, linear.biases],
                     template=[("T", x.dtype), ("K", k)], grid=(32, n // 16 * 8, 1), threadgroup=(32, 8, 1),
                     output_shapes=[(*x.shape[:-1], n)], output_dtypes=[x.dtype])[0]


def quantized(n: int, k: int, seed: int) -> nn.QuantizedLinear:
    lin = nn.Linear(k, n, bias=False)
    lin.weight = (mx.random.normal((n, k), key=mx.random.key(seed)) * k ** -0.5).astype(mx.bfloat16)
    q = nn.QuantizedLinear.from_linear(lin, group_size=64, bits=4)
    mx.eval(q.parameters())
    return q


def shape_row(name: str, n: int, k: int, calls: int = CALLS, distinct_bytes: float = DISTINCT_BYTES) -> dict:
    """One shape: each kernel's time a call, GB/s and relative error."""
    first = quantized(n, k, 0)
    nbytes = sum(a.nbytes for a in (first.weight, first.scales, first.biases))
    linears = [first] + [quantized(n, k, i) for i in range(1, max(1, int(-(-distinct_bytes // nbytes))))]
    x = mx.random.normal((1, k), key=mx.random.key(99)).astype(mx.bfloat16)
    ref = x.astype(mx.float32) @ mx.dequantize(first.weight, first.scales, first.biases, 64, 4, dtype=mx.float32).T
    split = cuda_qmv_split.split_k(n, k, 4)
    kernels = {"qmv": lambda m: cuda_qmv.linear_product(m, x), "mma": lambda m: qmv_mma(x, m),
               **({"split": lambda m: cuda_qmv_split.linear_product(m, x)} if split > 1 else {})}
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "bytes": nbytes, "distinct": len(linears), "split": split}
    for kernel, call in kernels.items():
        try:
            row[f"err_{kernel}"] = rel_err(call(first), ref)
            ms = median_ms(lambda: [call(linears[i % len(linears)]) for i in range(calls)], 7) / calls
        except Exception as failure:  # noqa: BLE001 - a kernel that fails is a row that says so
            row[f"{kernel}_error"] = repr(failure)
            continue
        row[f"{kernel}_ms"], row[f"{kernel}_gbs"] = ms, nbytes / ms / 1e6
    print(f"{name} ({n} x {k}): " + ", ".join(
        f"{kernel} {row[f'{kernel}_ms'] * 1e3:.1f} us ({row[f'{kernel}_gbs']:.0f} GB/s, rel err "
        f"{row[f'err_{kernel}']:.1e})" for kernel in kernels if f"{kernel}_ms" in row), flush=True)
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_qmv_mma.json"))
    a = ap.parse_args(argv)
    result = {"mlx": mx.__version__, "device": str(mx.default_device()),
              "rows": [shape_row(name, *SHAPES[name]) for name in a.shapes.split(",")]}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
