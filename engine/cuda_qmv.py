"""Our quantized matrix-vector kernel for MLX's CUDA backend (decode-sized inputs, 4 or 8 bits).

MLX's CUDA `quantized_matmul` for a few rows makes one pass over the weights per
row, each lane loading one chunk per loop step (from its source). This kernel reads
each weight once for up to `MAX_ROWS` input rows; in one pipelined decode step of a
64-layer 4-bit model at 128k tokens on the H200 it took the step from 28.5 to 17.9 ms
(`bench/gpu_kernels.py`, docs/benchmarks.md, *GPU engine*):

- one warp per `R` output rows, each lane a 16-byte chunk of packed weights per
  step (32 four-bit or 16 eight-bit values), the row's K fully known at compile
  time so the loop over chunks unrolls and loads overlap;
- dequantization without integer-to-float conversions: one byte permute (``prmt``) places a 4-bit value in the mantissa of
  the float 0.5 + q/256, an 8-bit value in 2^23 + q; the affine scale and bias are
  applied once per chunk, ``s * sum(x*q) + b * sum(x)``, in float32 throughout
  (MLX's kernel accumulates 4-bit products in bfloat16);
- activations are bfloat16 or float16, affine mode, group sizes 32/64/128.

Whether it runs is decided by measurement (`engine.decode_choice`: ours against
MLX's on the model's shapes, per device); it needs MLX's CUDA backend
(`mx.fast.cuda_kernel`) and is never used on the CPU or Metal.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend
from engine.cuda_backend import PRMT_HEADER, affine_problem

MAX_ROWS = 8
"""Most input rows one call takes (decode is 1; speculative verification a few)."""
ROW_BUCKETS = (1, 2, 4, 8)
"""Row counts compiled for (the kernel is compiled per row count at first use; other counts are padded:
a speculative round of 5 rows runs the 8-row kernel instead of compiling a sixth variant)."""

_HEADER = PRMT_HEADER + r"""
namespace codectx {
// Two 16-bit floats packed in a word -> two floats.
__device__ __forceinline__ void unpack2(uint32_t v, float& lo, float& hi, const __nv_bfloat16*) {
  lo = __uint_as_float(v << 16);
  hi = __uint_as_float(v & 0xFFFF0000u);
}
__device__ __forceinline__ void unpack2(uint32_t v, float& lo, float& hi, const __half*) {
  float2 f = __half22float2(*reinterpret_cast<const __half2*>(&v));
  lo = f.x;
  hi = f.y;
}
}  // namespace codectx
"""

_SOURCE = r"""
  constexpr int VPW = 32 / BITS;          // values per packed word
  constexpr int VPC = 4 * VPW;            // values per 16-byte chunk
  constexpr int CHUNKS = K / VPC;         // chunks per weight row
  constexpr int GROUPS = K / GS;
  constexpr int ITERS = (CHUNKS + 31) / 32;
  const int lane = threadIdx.x;
  const int row0 = (blockIdx.y * blockDim.y + threadIdx.y) * R;
  if (row0 >= N) return;

  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

  const uint4* wrow = reinterpret_cast<const uint4*>(w) + (size_t)row0 * CHUNKS;
#pragma unroll 4
  for (int it = 0; it < ITERS; ++it) {
    const int c = lane + it * 32;
    if (CHUNKS % 32 != 0 && c >= CHUNKS) break;
    const int g = (c * VPC) / GS;
    uint4 wq[R];
    float sc[R], bi[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wq[r] = wrow[(size_t)r * CHUNKS + c];
      sc[r] = static_cast<float>(scales[(size_t)(row0 + r) * GROUPS + g]);
      bi[r] = static_cast<float>(biases[(size_t)(row0 + r) * GROUPS + g]);
    }
    float d[M][R];
    float xs[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      xs[m] = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) d[m][r] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float xf[M][VPW];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const T* xp = x + (size_t)m * K + (size_t)c * VPC + j * VPW;
        uint32_t xw[VPW / 2];
        if constexpr (VPW == 8) {
          uint4 v = *reinterpret_cast<const uint4*>(xp);
          xw[0] = v.x; xw[1] = v.y; xw[2] = v.z; xw[3] = v.w;
        } else {
          uint2 v = *reinterpret_cast<const uint2*>(xp);
          xw[0] = v.x; xw[1] = v.y;
        }
#pragma unroll
        for (int i = 0; i < VPW / 2; ++i) {
          codectx::unpack2(xw[i], xf[m][2 * i], xf[m][2 * i + 1], x);
          xs[m] += xf[m][2 * i] + xf[m][2 * i + 1];
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t word = reinterpret_cast<const uint32_t*>(&wq[r])[j];
        float q[VPW];
        if constexpr (BITS == 4) {
          const uint32_t lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
          for (int b = 0; b < 4; ++b) {  // 0.5 + q/256: q in the mantissa of 0x3F000000
            q[2 * b] = __uint_as_float(codectx::prmt(lo, 0x3F000000u, 0x7054u | (b << 8)));
            q[2 * b + 1] = __uint_as_float(codectx::prmt(hi, 0x3F000000u, 0x7054u | (b << 8)));
          }
        } else {
#pragma unroll
          for (int b = 0; b < 4; ++b)  // 2^23 + q, exact
            q[b] = codectx::byte_f(word, b);
        }
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int v = 0; v < VPW; ++v) d[m][r] = fmaf(xf[m][v], q[v], d[m][r]);
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if constexpr (BITS == 4)  // sum(x*q) = 256 * (d - 0.5 * sum(x))
          acc[m][r] += 256.f * sc[r] * d[m][r] + (bi[r] - 128.f * sc[r]) * xs[m];
        else
          acc[m][r] += sc[r] * d[m][r] + bi[r] * xs[m];
      }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[m][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
      if (lane == 0) y[(size_t)m * N + row0 + r] = static_cast<T>(v);
    }
"""

WARPS = 8


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv", _SOURCE, _HEADER, input_names=["x", "w", "scales", "biases"],
                               output_names=["y"])


def rows_per_warp(n: int) -> int:
    """Output rows per warp: 2 for wide layers (x is read once for both), 1 where blocks would be few."""
    return 2 if n % 2 == 0 and n >= 4096 else 1


def unsupported(linear: Any, dtype: mx.Dtype) -> str | None:
    """Why this kernel cannot multiply `linear` for activations of `dtype` (None: it can)."""
    weight = linear["weight"]
    return _problem(getattr(linear, "mode", "affine"), linear.bits, linear.group_size, weight.ndim,
                    weight.shape[-1] * 32 // linear.bits, linear.get("biases") is not None, dtype,
                    str(mx.default_device()))


def takes(linear: Any, dtype: mx.Dtype) -> bool:
    """`unsupported(linear, dtype) is None`, asked on every decode-sized call (about 450 a step of a 64-layer
    model): the answer is kept on the linear for the last activation dtype and backend asked (a module's shape
    and bits do not change)."""
    key = (dtype, cuda_backend.cuda_available())
    known = linear.__dict__.get("_codectx_qmv")  # the instance's own attribute, outside the module's parameters
    if known is None or known[0] != key:
        known = linear.__dict__["_codectx_qmv"] = (key, unsupported(linear, dtype) is None)
    return known[1]


@functools.lru_cache(maxsize=None)
def _problem(mode: str, bits: int, group_size: int, ndim: int, k: int, biases: bool, dtype: mx.Dtype,
             device: str) -> str | None:
    problem = affine_problem(mode, bits, dtype, biases)
    if problem is None and (group_size % (128 // bits) or k % group_size or ndim != 2):
        return f"group size {group_size} over K={k}"
    return problem


def qmv(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, *, bits: int, group_size: int) -> mx.array:
    """``x @ dequantize(weight).T`` for x of at most `MAX_ROWS` rows (leading axes flattened).

    Args:
        x: (..., K) bfloat16 or float16, rows = product of the leading axes <= MAX_ROWS.
        weight: (N, K * bits / 32) uint32, MLX's affine packing.
        scales, biases: (N, K / group_size) in x's dtype.

    Returns:
        (..., N) in x's dtype.
    """
    k = x.shape[-1]
    n = weight.shape[0]
    rows = x.size // k
    bucket = _bucket(rows)  # raises for more than MAX_ROWS
    r = rows_per_warp(n)
    warps = n // r
    if bucket == rows:  # the kernel reads x and writes y as flat rows: no reshape either side (decode's case)
        x2, shape = x, (*x.shape[:-1], n)
    else:  # zero rows up to the bucket: one compiled kernel per bucket, not per row count
        x2 = mx.concatenate([x.reshape(rows, k), mx.zeros((bucket - rows, k), dtype=x.dtype)])
        shape = (bucket, n)
    out = _kernel()(
        inputs=[x2, weight, scales, biases],
        template=[("T", x.dtype), ("BITS", bits), ("GS", group_size), ("K", k), ("N", n), ("M", bucket), ("R", r)],
        grid=(32, (warps + WARPS - 1) // WARPS * WARPS, 1), threadgroup=(32, WARPS, 1),
        output_shapes=[shape], output_dtypes=[x.dtype])[0]
    return out if bucket == rows else out[:rows].reshape(*x.shape[:-1], n)


def _bucket(rows: int) -> int:
    """The smallest of `ROW_BUCKETS` that holds `rows` (a loop, not a generator: asked for every linear of a step)."""
    for bucket in ROW_BUCKETS:
        if bucket >= rows:
            return bucket
    raise ValueError(f"qmv takes at most {MAX_ROWS} rows, got {rows}")


def linear_product(linear: Any, x: mx.array) -> mx.array:
    """`linear(x)` through `qmv` (the caller checked `unsupported` and the row count)."""
    y = qmv(x, linear["weight"], linear["scales"], linear["biases"], bits=linear.bits, group_size=linear.group_size)
    return y + linear["bias"] if "bias" in linear else y
