"""Our dequantize kernel for MLX's CUDA backend: a packed 4- or 8-bit weight to bfloat16/float16.

The dequantized linear mode (`engine.linear_mode`) turns a layer's packed weight into the
activations' dtype for one prefill-sized product and multiplies with the dense matmul. MLX's
CUDA `dequantize` gives each thread one byte of packed weights (two 4-bit values) and writes
them with 2-byte stores. Here each thread takes eight values (one 4-bit word or two 8-bit
words) and writes them with one 16-byte store, so a warp's loads and stores are each one
contiguous span:

- a 4-bit value becomes a float without an integer conversion (one byte permute places it
  in the mantissa of 0.5 + q/256, as in `engine.cuda_qmv`), an 8-bit one as 2^23 + q;
- ``q * scale + bias`` in float32, rounded once to the output dtype.

Its output equals MLX's own `dequantize` bit for bit (on the H200: every value of a
Qwen3-32B block's seven linears at 4 and 8 bits, `bench/gpu_kernels.py` section ``dequant``,
where it took 0.60 ms per block against MLX's 1.22 at 4 bits). That is not assumed at run
time: `weight_of` uses the kernel only after `matches_mlx` found it equal on a random weight
of the same bits, group size and dtype in this process, so the dequantized linear mode
computes the same numbers either way. The 8-bit KV store's dequantized slices (`rows_of`, for
prefill chunks and questions over an 8-bit cache) take a second kernel of the same arithmetic that reads
the slice where it lies (`dequantize_rows`), under the same rule (`rows_match_mlx`, on a strided slice).
Sizes are kernel inputs, not template constants: one build serves every row count. Never used on the
CPU or Metal.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend
from engine.cuda_backend import PRMT_HEADER, affine_problem

VALUES_PER_THREAD = 8

_HEADER = PRMT_HEADER + r"""
namespace codectx {
__device__ __forceinline__ uint32_t pack2(float lo, float hi, const __nv_bfloat16*) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, const __half*) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
}  // namespace codectx
"""

_VALUES = r"""  float q[8];
  if constexpr (BITS == 4) {
    const uint32_t word = wp[0];
    const uint32_t lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // (0.5 + q/256 - 0.5) * 256 = q, exact
      q[2 * i] = (__uint_as_float(codectx::prmt(lo, 0x3F000000u, 0x7054u | (i << 8))) - 0.5f) * 256.f;
      q[2 * i + 1] = (__uint_as_float(codectx::prmt(hi, 0x3F000000u, 0x7054u | (i << 8))) - 0.5f) * 256.f;
    }
  } else {
    const uint2 words = reinterpret_cast<const uint2*>(wp)[0];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 2^23 + q - 2^23 = q, exact
      q[i] = codectx::byte_f(words.x, i);
      q[4 + i] = codectx::byte_f(words.y, i);
    }
  }
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = fmaf(q[i], s, b);
  uint4 packed;
  packed.x = codectx::pack2(v[0], v[1], out);
  packed.y = codectx::pack2(v[2], v[3], out);
  packed.z = codectx::pack2(v[4], v[5], out);
  packed.w = codectx::pack2(v[6], v[7], out);
  reinterpret_cast<uint4*>(out)[o] = packed;
"""
"""Eight values from the packed words at ``wp`` with their group's scale ``s`` and bias ``b``, stored as
one 16-byte write at ``out[o]`` (``o`` in 16-byte units)."""

_SOURCE = r"""
  const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (size_t)count[0]) return;
  const size_t g = (t * 8) / GS;
  const float s = static_cast<float>(scales[g]);
  const float b = static_cast<float>(biases[g]);
  const uint32_t* wp = w + t * (BITS == 4 ? 1 : 2);
  const size_t o = t;
""" + _VALUES

_ROWS_SOURCE = r"""
  // Rows of a (B, H, rows, words) buffer slice read where they lie (any batch, head and row stride; the
  // words of a row contiguous), eight values a thread, written contiguous. The grid's y is batch x head and
  // K (values a row) a constant, so a thread finds its row and column by a shift, not by 64-bit divisions
  // (the first version's: 21.0-22.4 against 20.3 ms for a forward's 128 calls at 132k rows on the H100).
  constexpr int PER_ROW = K / 8;  // threads a row
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int rows = sizes[0], heads = sizes[1];
  if (t >= rows * PER_ROW) return;
  const int row = t / PER_ROW, col = t % PER_ROW, bi = blockIdx.y / heads, h = blockIdx.y % heads;
  const int g = (col * 8) / GS;
  const float s = static_cast<float>(
      scales[bi * scales_strides[0] + h * scales_strides[1] + row * scales_strides[2] + g]);
  const float b = static_cast<float>(
      biases[bi * biases_strides[0] + h * biases_strides[1] + row * biases_strides[2] + g]);
  const uint32_t* wp = w + bi * w_strides[0] + h * w_strides[1] + row * w_strides[2] + col * (BITS == 4 ? 1 : 2);
  const size_t o = ((size_t)blockIdx.y * rows + row) * PER_ROW + col;
""" + _VALUES


THREADS = 256


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_dequantize", _SOURCE, _HEADER, input_names=["w", "scales", "biases", "count"],
                               output_names=["out"])


@functools.lru_cache(maxsize=1)
def _rows_kernel() -> Any:
    return cuda_backend.kernel("codectx_dequantize_rows", _ROWS_SOURCE, _HEADER,
                               input_names=["w", "scales", "biases", "sizes"], output_names=["out"],
                               ensure_row_contiguous=False)


def dequantize_rows(packed: mx.array, scales: mx.array, biases: mx.array, *, bits: int,
                    group_size: int) -> mx.array:
    """`mx.dequantize` of a (B, H, rows, words) slice of a KV store's buffers and its (B, H, rows, groups)
    scales and biases, read where they lie (no contiguous copy first), to the scales' dtype, contiguous
    (B, H, rows, K). Each row's words, scales and biases must be contiguous (a slice along the rows is)."""
    B, H, rows, _ = packed.shape
    k = packed.shape[-1] * 32 // bits
    threads = rows * k // VALUES_PER_THREAD
    return _rows_kernel()(
        inputs=[packed, scales, biases, cuda_backend.int32s(rows, H)],
        template=[("T", scales.dtype), ("BITS", bits), ("GS", group_size), ("K", k)],
        grid=(-(-threads // THREADS) * THREADS, B * H, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=[(B, H, rows, k)], output_dtypes=[scales.dtype])[0]


def unsupported(bits: int, group_size: int, k: int, dtype: mx.Dtype, biases: bool = True,
                mode: str = "affine") -> str | None:
    """Why the kernel cannot dequantize this weight to `dtype` (None: it can)."""
    problem = affine_problem(mode, bits, dtype, biases)
    if problem is None and (group_size % VALUES_PER_THREAD or k % group_size):
        return f"group size {group_size} over K={k}"
    return problem


def dequantize(weight: mx.array, scales: mx.array, biases: mx.array, *, bits: int, group_size: int,
               dtype: mx.Dtype) -> mx.array:
    """`mx.dequantize(weight, scales, biases, group_size, bits, dtype=dtype)` for a 2-D affine weight.

    Args:
        weight: (N, K * bits / 32) uint32.
        scales, biases: (N, K / group_size).

    Returns:
        (N, K) in `dtype`.
    """
    n = weight.shape[0]
    k = weight.shape[-1] * 32 // bits
    count = n * k // VALUES_PER_THREAD
    return _kernel()(  # the count an input, not a template constant: one build serves every row count
        inputs=[weight, scales, biases, cuda_backend.int32s(count)],
        template=[("T", dtype), ("BITS", bits), ("GS", group_size)],
        grid=(-(-count // THREADS) * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=[(n, k)], output_dtypes=[dtype])[0]


@functools.lru_cache(maxsize=None)
def matches_mlx(bits: int, group_size: int, dtype: mx.Dtype) -> bool:
    """Whether the kernel's output equals `mx.dequantize`'s bit for bit on a random weight (once per process)."""
    w = mx.random.normal((256, 4 * group_size), key=mx.random.key(17)).astype(dtype)
    packed, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    try:
        ours = dequantize(packed, scales, biases, bits=bits, group_size=group_size, dtype=dtype)
        theirs = mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits, dtype=dtype)
        return bool(mx.array_equal(ours, theirs).item())
    except Exception:  # noqa: BLE001 - a kernel that fails to build or run is not used
        return False


def weight_of(linear: Any, dtype: mx.Dtype) -> mx.array:
    """`linear`'s weight dequantized to `dtype`: by this kernel where it applies and matches MLX, else by MLX."""
    weight, scales, biases = linear["weight"], linear["scales"], linear.get("biases")
    mode, bits, group_size = getattr(linear, "mode", "affine"), linear.bits, linear.group_size
    if _applies(bits, group_size, weight.ndim, weight.shape[-1] * 32 // bits, dtype, scales.dtype, biases is not None,
                mode, str(mx.default_device())):
        return dequantize(weight, scales, biases, bits=bits, group_size=group_size, dtype=dtype)
    return mx.dequantize(weight, scales, biases, group_size, bits, mode=mode, dtype=dtype)


def rows_of(packed: mx.array, scales: mx.array, biases: mx.array, *, bits: int, group_size: int) -> mx.array:
    """Rows of an 8-bit KV store, (B, H, rows, D * bits / 32) slices of its buffers with their scales and biases,
    dequantized to the scales' dtype: by `dequantize_rows` (read where they lie: MLX's own dequantize copies a
    slice contiguous first, a pass over the whole history per layer) where it applies and `rows_match_mlx`, else
    by MLX's (the CPU's case); the output is contiguous, shaped as `mx.dequantize`'s."""
    k = packed.shape[-1] * 32 // bits
    if packed.size == 0 or packed.ndim != 4 or not _rows_apply(bits, group_size, k, scales.dtype,
                                                              str(mx.default_device())):
        return mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits)
    return dequantize_rows(packed, scales, biases, bits=bits, group_size=group_size)


@functools.lru_cache(maxsize=None)
def rows_match_mlx(bits: int, group_size: int, dtype: mx.Dtype, k: int) -> bool:
    """Whether `dequantize_rows` equals `mx.dequantize` bit for bit on a random slice of a store-shaped buffer of
    rows of `k` values (a template constant: each row width builds its own kernel; rows strided across heads, an
    odd start and count; once per process)."""
    buffer = mx.random.normal((1, 4, 512, k), key=mx.random.key(19)).astype(dtype)
    parts = [a[..., 37:290, :] for a in mx.quantize(buffer, group_size=group_size, bits=bits)]
    try:
        ours = dequantize_rows(*parts, bits=bits, group_size=group_size)
        theirs = mx.dequantize(*parts, group_size=group_size, bits=bits, dtype=dtype)
        return bool(mx.array_equal(ours, theirs).item())
    except Exception:  # noqa: BLE001 - a kernel that fails to build or run is not used
        return False


@functools.lru_cache(maxsize=None)
def _rows_apply(bits: int, group_size: int, k: int, dtype: mx.Dtype, device: str) -> bool:
    """`rows_of`'s verdict per row width and device (asked for every layer of every prefill chunk)."""
    return unsupported(bits, group_size, k, dtype) is None and rows_match_mlx(bits, group_size, dtype, k)


@functools.lru_cache(maxsize=None)
def _applies(bits: int, group_size: int, ndim: int, k: int, dtype: mx.Dtype, scales_dtype: mx.Dtype, biases: bool,
             mode: str, device: str) -> bool:
    """`weight_of`'s verdict per weight shape and device (asked for every linear of every prefill chunk).
    `matches_mlx` checked scales of the output's dtype only, so other scales go to MLX."""
    return (ndim == 2 and scales_dtype == dtype and unsupported(bits, group_size, k, dtype, biases, mode) is None
            and matches_mlx(bits, group_size, dtype))
