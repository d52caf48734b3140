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

`three` (a block's q, k and v projections) and `glu` (a gated MLP's ``silu(gate x) * up x``) run the
same device code over several matrices of one input in one launch (`engine.fused_linears`).

Whether it runs is decided by measurement (`engine.decode_choice`: ours against
MLX's on the model's shapes, per device); it needs MLX's CUDA backend
(`mx.fast.cuda_kernel`) and is never used on the CPU or Metal.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn

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

_CONSTANTS = r"""
  constexpr int VPW = 32 / BITS;          // values per packed word
  constexpr int VPC = 4 * VPW;            // values per 16-byte chunk
  constexpr int CHUNKS = K / VPC;         // chunks per weight row
  constexpr int GROUPS = K / GS;
  constexpr int ITERS = (CHUNKS + 31) / 32;
  const int lane = threadIdx.x;
"""
# The products of the warp's R rows with the M input rows: acc[m][r], summed over the warp's lanes below.
_LOOP = r"""
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

#pragma unroll 4
  for (int it = 0; it < ITERS; ++it) {
    const int c = lane + it * 32;
    if (CHUNKS % 32 != 0 && c >= CHUNKS) break;
    const int g = (c * VPC) / GS;
    uint4 wq[R];
    float sc[R], bi[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wq[r] = wrow[r][c];
      sc[r] = static_cast<float>(srow[r][g]);
      bi[r] = static_cast<float>(brow[r][g]);
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
"""
_STORE = r"""
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


# Where the packed weights, scales and biases of a warp's R consecutive rows from `row0` of one matrix (`w`,
# `scales`, `biases`) start: `_LOOP` reads them through these.
_ROWS = r"""
  const uint4* wrow[R];
  const T* srow[R];
  const T* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    wrow[r] = reinterpret_cast<const uint4*>(w) + (size_t)(row0 + r) * CHUNKS;
    srow[r] = scales + (size_t)(row0 + r) * GROUPS;
    brow[r] = biases + (size_t)(row0 + r) * GROUPS;
  }
"""

_SOURCE = _CONSTANTS + r"""
  const int row0 = (blockIdx.y * blockDim.y + threadIdx.y) * R;
  if (row0 >= N) return;
""" + _ROWS + _LOOP + _STORE

# Three linears of one input (a block's q, k and v projections) in one launch: the warps' rows run through the
# three matrices in turn (each count a multiple of R), each matrix's products written to its own output.
_THREE = _CONSTANTS + r"""
  const int row = (blockIdx.y * blockDim.y + threadIdx.y) * R;
  if (row >= N0 + N1 + N2) return;
  const int which = row < N0 ? 0 : row < N0 + N1 ? 1 : 2;
  const uint32_t* w = which == 0 ? w0 : which == 1 ? w1 : w2;
  const T* scales = which == 0 ? s0 : which == 1 ? s1 : s2;
  const T* biases = which == 0 ? b0 : which == 1 ? b1 : b2;
  T* y = which == 0 ? y0 : which == 1 ? y1 : y2;
  const int N = which == 0 ? N0 : which == 1 ? N1 : N2;
  const int row0 = row - (which == 0 ? 0 : which == 1 ? N0 : N0 + N1);
""" + _ROWS + _LOOP + _STORE

# A gated MLP's two products of one input and its activation (silu(gate x) * up x) in one launch: each warp one
# output row, its two rows (R = 2) the gate's and the up projection's, combined in float32 and rounded once.
_GLU = _CONSTANTS + r"""
  static_assert(R == 2, "a warp takes the gate's row and the up projection's");
  const int row0 = blockIdx.y * blockDim.y + threadIdx.y;
  if (row0 >= N) return;
  const uint4* wrow[2] = {reinterpret_cast<const uint4*>(gw) + (size_t)row0 * CHUNKS,
                          reinterpret_cast<const uint4*>(uw) + (size_t)row0 * CHUNKS};
  const T* srow[2] = {gs + (size_t)row0 * GROUPS, us + (size_t)row0 * GROUPS};
  const T* brow[2] = {gb + (size_t)row0 * GROUPS, ub + (size_t)row0 * GROUPS};
""" + _LOOP + r"""
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float gate = acc[m][0], up = acc[m][1];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      gate += __shfl_xor_sync(0xFFFFFFFFu, gate, o);
      up += __shfl_xor_sync(0xFFFFFFFFu, up, o);
    }
    if (lane == 0) y[(size_t)m * N + row0] = static_cast<T>(gate / (1.f + __expf(-gate)) * up);
  }
"""

WARPS = 8


def with_residual(source: str, value: str) -> str:
    """`source` whose one store of `value` into ``y[m * N + row0 + r]`` adds that element of ``res`` (an input of y's
    shape) in float32 first: a block's residual add in the product's launch (`engine.fused_residual`)."""
    store = f"static_cast<T>({value})"
    if source.count(store) != 1:
        raise RuntimeError(f"engine.cuda_qmv: a kernel's store of {value} changed; its residual form needs one")
    return source.replace(store, f"static_cast<T>({value} + static_cast<float>(res[(size_t)m * N + row0 + r]))")


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv", _SOURCE, _HEADER, input_names=["x", "w", "scales", "biases"],
                               output_names=["y"])


@functools.lru_cache(maxsize=1)
def _residual_kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv_residual", with_residual(_SOURCE, "v"), _HEADER,
                               input_names=["x", "w", "scales", "biases", "res"], output_names=["y"])


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
    model), answered once per linear (`cuda_backend.kept_verdict`)."""
    return cuda_backend.kept_verdict(linear, "_codectx_qmv", dtype, lambda: unsupported(linear, dtype) is None)


@functools.lru_cache(maxsize=None)
def _problem(mode: str, bits: int, group_size: int, ndim: int, k: int, biases: bool, dtype: mx.Dtype,
             device: str) -> str | None:
    problem = affine_problem(mode, bits, dtype, biases)
    if problem is None and (group_size % (128 // bits) or k % group_size or ndim != 2):
        return f"group size {group_size} over K={k}"
    return problem


def qmv(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, *, bits: int, group_size: int,
        residual: mx.array | None = None) -> mx.array:
    """``x @ dequantize(weight).T`` for x (..., K), bfloat16 or float16, of at most `MAX_ROWS` rows (leading axes
    flattened), plus `residual` (added in the launch where `takes_residual`); weight (N, K * bits / 32) uint32 in
    MLX's affine packing, scales and biases (N, K / group_size) in x's dtype. Returns (..., N) in x's dtype."""
    return launch((_kernel, _residual_kernel), x, weight, scales, biases, bits=bits, group_size=group_size,
                  residual=residual)


def launch(kernels: tuple[Any, Any], x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, *, bits: int,
           group_size: int, residual: mx.array | None = None, split: int = 1,
           template: tuple[tuple[str, Any], ...] = ()) -> mx.array:
    """The launch of `qmv` and of `engine.cuda_qmv_split.qmv`: `kernels` (the plain kernel's factory, the one adding
    `residual`), x padded to its row bucket, `rows_per_warp` rows a warp and `split` warps a row group, `template`
    after the shared constants."""
    k, n = x.shape[-1], weight.shape[0]
    x2, rows, bucket = _padded(x)
    r = rows_per_warp(n)
    warps = n // r * split
    fused = takes_residual(residual, x, rows, bucket, n)
    out = (kernels[1] if fused else kernels[0])()(
        inputs=[x2, weight, scales, biases, *((residual,) if fused else ())],
        template=[("T", x.dtype), ("BITS", bits), ("GS", group_size), ("K", k), ("N", n), ("M", bucket), ("R", r),
                  *template],
        grid=(32, (warps + WARPS - 1) // WARPS * WARPS, 1), threadgroup=(32, WARPS, 1),
        output_shapes=[_out_shape(x, bucket, rows, n)], output_dtypes=[x.dtype])[0]
    out = _unpadded(out, x, rows, bucket)
    return out if residual is None or fused else residual + out


def takes_residual(residual: mx.array | None, x: mx.array, rows: int, bucket: int, n: int) -> bool:
    """Whether a product of `x` (`rows` in a `bucket`) into `n` outputs adds `residual` in its launch (else MLX adds)."""
    return residual is not None and bucket == rows and residual.dtype == x.dtype and residual.shape == (*x.shape[:-1], n)


def _bucket(rows: int) -> int:
    """The smallest of `ROW_BUCKETS` that holds `rows` (a loop, not a generator: asked for every linear of a step)."""
    for bucket in ROW_BUCKETS:
        if bucket >= rows:
            return bucket
    raise ValueError(f"qmv takes at most {MAX_ROWS} rows, got {rows}")


def linear_product(linear: Any, x: mx.array, residual: mx.array | None = None, product: Any = None) -> mx.array:
    """`linear(x)` through `product` (`qmv`, or another kernel of its signature: `engine.cuda_qmv_split`'s; the caller
    checked `unsupported` and the row count), plus `residual` where given: in the launch for a linear without a
    bias, else after the bias, in the order MLX's calls add them."""
    bias = linear["bias"] if "bias" in linear else None
    y = (product or qmv)(x, linear["weight"], linear["scales"], linear["biases"], bits=linear.bits,
                         group_size=linear.group_size, residual=residual if bias is None else None)
    if bias is None:
        return y
    y = y + bias
    return y if residual is None else residual + y


@functools.lru_cache(maxsize=1)
def _three_kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv3", _THREE, _HEADER,
                               input_names=["x", "w0", "s0", "b0", "w1", "s1", "b1", "w2", "s2", "b2"],
                               output_names=["y0", "y1", "y2"])


@functools.lru_cache(maxsize=1)
def _glu_kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv_glu", _GLU, _HEADER, input_names=["x", "gw", "gs", "gb", "uw", "us", "ub"],
                               output_names=["y"])


def fusable(linears: Sequence[Any], dtype: mx.Dtype) -> bool:
    """Whether `three` (three linears) or `glu` (two) takes `linears` for activations of `dtype`: each a quantized
    linear this module's kernel takes (`takes`), all of one input width, bits and group size; for `glu`, of one
    output width and without a linear bias."""
    first = linears[0]
    if not all(isinstance(linear, nn.QuantizedLinear) for linear in linears):
        return False
    if not all(takes(linear, dtype) and linear.bits == first.bits and linear.group_size == first.group_size
               and linear["weight"].shape[-1] == first["weight"].shape[-1] for linear in linears):
        return False
    return len(linears) == 3 or (all(linear["weight"].shape[0] == first["weight"].shape[0] for linear in linears)
                                 and not any("bias" in linear for linear in linears))


def three(x: mx.array, linears: Sequence[Any]) -> tuple[mx.array, mx.array, mx.array]:
    """``tuple(linear(x) for linear in linears)`` for three quantized linears of one input (a block's q, k and v
    projections; `fusable`) in one launch, x of at most `MAX_ROWS` rows (leading axes flattened)."""
    first = linears[0]
    k, ns = x.shape[-1], [linear["weight"].shape[0] for linear in linears]
    x2, rows, bucket = _padded(x)
    r = rows_per_warp(sum(ns)) if all(n % 2 == 0 for n in ns) else 1  # a warp's rows inside one matrix
    warps = sum(ns) // r
    outs = _three_kernel()(
        inputs=[x2, *(linear[name] for linear in linears for name in ("weight", "scales", "biases"))],
        template=[("T", x.dtype), ("BITS", first.bits), ("GS", first.group_size), ("K", k), ("N0", ns[0]),
                  ("N1", ns[1]), ("N2", ns[2]), ("M", bucket), ("R", r)],
        grid=(32, (warps + WARPS - 1) // WARPS * WARPS, 1), threadgroup=(32, WARPS, 1),
        output_shapes=[_out_shape(x, bucket, rows, n) for n in ns], output_dtypes=[x.dtype] * 3)
    outs = [_unpadded(out, x, rows, bucket) for out in outs]
    return tuple(out + linear["bias"] if "bias" in linear else out for out, linear in zip(outs, linears))


def glu(x: mx.array, gate: Any, up: Any) -> mx.array:
    """``silu(gate(x)) * up(x)`` (a gated MLP's hidden activation; `fusable`) in one launch, in float32 and rounded
    once, x of at most `MAX_ROWS` rows (leading axes flattened)."""
    k, n = x.shape[-1], gate["weight"].shape[0]
    x2, rows, bucket = _padded(x)
    out = _glu_kernel()(
        inputs=[x2, *(linear[name] for linear in (gate, up) for name in ("weight", "scales", "biases"))],
        template=[("T", x.dtype), ("BITS", gate.bits), ("GS", gate.group_size), ("K", k), ("N", n), ("M", bucket),
                  ("R", 2)],
        grid=(32, (n + WARPS - 1) // WARPS * WARPS, 1), threadgroup=(32, WARPS, 1),
        output_shapes=[_out_shape(x, bucket, rows, n)], output_dtypes=[x.dtype])[0]
    return _unpadded(out, x, rows, bucket)


def _padded(x: mx.array) -> tuple[mx.array, int, int]:
    """x as the kernels read it, its rows and their bucket: the rows as they lie where they fill the bucket (no
    reshape either side: decode's case), else zero rows up to it (one compiled kernel per bucket, not per count)."""
    k = x.shape[-1]
    rows = x.size // k
    bucket = _bucket(rows)  # raises for more than MAX_ROWS
    if bucket == rows:
        return x, rows, bucket
    return mx.concatenate([x.reshape(rows, k), mx.zeros((bucket - rows, k), dtype=x.dtype)]), rows, bucket


def _out_shape(x: mx.array, bucket: int, rows: int, n: int) -> tuple[int, ...]:
    return (*x.shape[:-1], n) if bucket == rows else (bucket, n)


def _unpadded(out: mx.array, x: mx.array, rows: int, bucket: int) -> mx.array:
    """A kernel's output (`_out_shape`) without `_padded`'s zero rows, shaped as x's leading axes."""
    return out if bucket == rows else out[:rows].reshape(*x.shape[:-1], out.shape[-1])
