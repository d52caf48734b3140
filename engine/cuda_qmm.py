"""Our quantized product for a few dozen rows on tensor cores (MLX's CUDA backend, 4 or 8 bits).

A question, a response header or a verify forward multiplies 9..`MAX_ROWS` rows by every
weight of the model. MLX's `quantized_matmul` for such inputs ran at a tenth of the weights'
read bandwidth on the H200 (64 rows: 1.98 ms for one Qwen3-32B block's linears, 268 MB of
weights; dequantizing the weights first cost the same), so the 45-token forward of an ask at
128k tokens spent about 0.1 s in its linears (docs/benchmarks.md, *GPU engine*). This kernel
reads each weight once for all the rows:

- the product is computed as ``y.T = W @ x.T`` with bf16 ``mma.sync`` m16n8k16 and float32
  accumulators: 16 output features (weight rows) by 8 input rows per instruction, so the
  weights are the operand streamed from memory and the rows the one reused;
- each lane loads 16 bytes of packed weights per row per chunk (32 four-bit or 16 eight-bit
  values) and dequantizes them in registers (``s * q + b`` in float32, rounded to bf16);
  the product sums over K in any order, so the lane's four values of an instruction are
  four consecutive ones (K permuted alike for both operands) and nothing is shuffled;
- a block (eight warps, 32 features each) stages each chunk of the rows in shared memory
  once, laid out so each lane's 8-byte read meets no bank conflict;
- where the features give too few blocks for the SMs, the chunks of K are split over the
  grid's second dimension; the splits' float32 partial sums are added in a fixed order
  (deterministic, no atomics).

Whether it runs is decided by measurement (`engine.decode_choice`: ``qmm``, against the
faster of MLX's quantized and dequantized products on the model's shapes, per device);
never on the CPU or Metal.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend
from engine.cuda_attention_mma import HEADER

MAX_ROWS = 64
"""Most input rows one call takes."""
WARPS = 8
FEATURES_PER_WARP = 32
TARGET_BLOCKS = 264
"""Blocks a call aims for (two per SM of the H200) when splitting K."""

SOURCE = r"""
  // lane = 4 r + c. Tile t of this warp: features f0 + 16 t + r (and + 8). Instruction s of a chunk: the
  // lane's values c * VPL + 4 s + j (j = 0..3) of the chunk, for its weight rows and the block's input rows.
  constexpr int VPL = 128 / BITS;            // values per 16-byte load
  constexpr int STEPS = VPL / 4;             // instructions per chunk
  constexpr int KC = 4 * VPL;                // K per chunk
  constexpr int CHUNKS = K / KC;
  constexpr int GROUPS = K / GS;
  constexpr int RS = KC / 4 + 4;             // staged row stride in 8-byte pieces (padded: no bank conflicts)
  constexpr int ROWS = 8 * MT;
  __shared__ __align__(16) uint2 xs[ROWS * RS];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r = lane >> 2, c = lane & 3;
  const int M = meta[0];
  const int f0 = blockIdx.x * (blockDim.x >> 5) * 32 + warp * 32;
  const bool active = f0 < N;
  const int split = blockIdx.y, splits = gridDim.y;
  const int first = (int)((long long)split * CHUNKS / splits), last = (int)((long long)(split + 1) * CHUNKS / splits);

  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint2* xv = reinterpret_cast<const uint2*>(x);
  // Rows of tile t, half h: f0 + 16 t + r + 8 h.
  auto load = [&](uint4 (&q)[2][2], int ch) {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        q[t][h] = wv[(size_t)(f0 + 16 * t + r + 8 * h) * (K * BITS / 128) + ch * 4 + c];
  };

  float acc[2][MT][4];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int n = 0; n < MT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][n][e] = 0.f;

  uint4 wq[2][2], wn[2][2];
  if (active && first < last) load(wq, first);
  for (int ch = first; ch < last; ++ch) {
    __syncthreads();  // the previous chunk's reads of xs are done
    for (int i = tid; i < ROWS * (KC / 4); i += blockDim.x) {
      const int row = i / (KC / 4), p = i % (KC / 4);  // piece p: values 4p..4p+3 = lane p / STEPS, step p % STEPS
      xs[row * RS + (p % STEPS) * 4 + p / STEPS] =
          row < M ? xv[(size_t)row * (K / 4) + ch * (KC / 4) + p] : make_uint2(0u, 0u);
    }
    __syncthreads();
    if (!active) continue;
    if (ch + 1 < last) load(wn, ch + 1);
    const int g = (ch * KC + c * VPL) / GS;
    float sa[2][2], sb[2][2];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const size_t at = (size_t)(f0 + 16 * t + r + 8 * h) * GROUPS + g;
        const float s = static_cast<float>(scales[at]), b = static_cast<float>(biases[at]);
        if constexpr (BITS == 4) {  // q arrives as 0.5 + q / 256: s q + b = (256 s) f + (b - 128 s)
          sa[t][h] = 256.f * s;
          sb[t][h] = b - 128.f * s;
        } else {
          sa[t][h] = s;
          sb[t][h] = b;
        }
      }
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
      uint32_t a[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v[4];
          if constexpr (BITS == 4) {
            const uint32_t word = reinterpret_cast<const uint32_t*>(&wq[t][h])[s >> 1];
            const uint32_t lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu;  // nibbles 0,2,4,6 / 1,3,5,7
            const uint32_t b0 = 2 * (s & 1);                                        // values 4(s&1) .. +3
            v[0] = __uint_as_float(codectx::prmt(lo, 0x3F000000u, 0x7054u | (b0 << 8)));
            v[1] = __uint_as_float(codectx::prmt(hi, 0x3F000000u, 0x7054u | (b0 << 8)));
            v[2] = __uint_as_float(codectx::prmt(lo, 0x3F000000u, 0x7054u | ((b0 + 1) << 8)));
            v[3] = __uint_as_float(codectx::prmt(hi, 0x3F000000u, 0x7054u | ((b0 + 1) << 8)));
          } else {
            const uint32_t word = reinterpret_cast<const uint32_t*>(&wq[t][h])[s];
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = codectx::byte_f(word, j);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) v[j] = fmaf(v[j], sa[t][h], sb[t][h]);
          a[t][h] = codectx::bf2(v[0], v[1]);      // k 2c, 2c+1 of row r + 8 h
          a[t][2 + h] = codectx::bf2(v[2], v[3]);  // k 2c+8, 2c+9
        }
#pragma unroll
      for (int n = 0; n < MT; ++n) {
        const uint2 bx = xs[(8 * n + r) * RS + s * 4 + c];  // input row 8 n + r, the same four values
#pragma unroll
        for (int t = 0; t < 2; ++t) codectx::mma16816(acc[t][n], a[t][0], a[t][1], a[t][2], a[t][3], bx.x, bx.y);
      }
    }
    if (ch + 1 < last) {
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) wq[t][h] = wn[t][h];
    }
  }
  if (!active) return;
  // acc[t][n][e]: feature f0 + 16 t + r + 8 (e >> 1), input row 8 n + 2 c + (e & 1).
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int n = 0; n < MT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 8 * n + 2 * c + (e & 1), f = f0 + 16 * t + r + 8 * (e >> 1);
        if (m < M) y[((size_t)split * M + m) * N + f] = static_cast<O>(acc[t][n][e]);
      }
"""


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_qmm", SOURCE, HEADER, input_names=["x", "w", "scales", "biases", "meta"],
                               output_names=["y"])


def shape_problem(n: int, k: int, bits: int, group_size: int) -> str | None:
    """Why the kernel cannot multiply by an (n, k) weight of `bits` bits, `group_size` per scale (None: it can)."""
    if bits not in (4, 8):
        return f"{bits}-bit weights"
    chunk = 4 * 128 // bits
    if n % FEATURES_PER_WARP:
        return f"N={n} is not a multiple of {FEATURES_PER_WARP}"
    if k % chunk:
        return f"K={k} is not a multiple of {chunk}"
    if group_size % (128 // bits) or k % group_size:
        return f"group size {group_size} over K={k}"
    return None


def unsupported(linear: Any, dtype: mx.Dtype) -> str | None:
    """Why this kernel cannot multiply `linear` for activations of `dtype` (None: it can)."""
    weight = linear["weight"]
    return _problem(getattr(linear, "mode", "affine"), linear.bits, linear.group_size, tuple(weight.shape),
                    linear.get("biases") is not None, dtype, str(mx.default_device()))


def takes(linear: Any, dtype: mx.Dtype) -> bool:
    """`unsupported(linear, dtype) is None`, asked on every call (the answer is cached per shape)."""
    return unsupported(linear, dtype) is None


@functools.lru_cache(maxsize=None)
def _problem(mode: str, bits: int, group_size: int, shape: tuple[int, ...], biases: bool, dtype: mx.Dtype,
             device: str) -> str | None:
    problem = cuda_backend.affine_problem(mode, bits, dtype, biases)
    if problem is None and dtype != mx.bfloat16:
        return f"{dtype} activations (the products are bf16)"
    if problem is None and len(shape) != 2:
        return f"a {len(shape)}-d weight"
    return problem or shape_problem(shape[0], shape[1] * 32 // bits, bits, group_size)


def splits(n: int, k: int, bits: int) -> int:
    """How many parts K is split into: enough blocks for `TARGET_BLOCKS`, at most one chunk each."""
    blocks = -(-n // (WARPS * FEATURES_PER_WARP))
    chunks = k // (4 * 128 // bits)
    return max(1, min(chunks, round(TARGET_BLOCKS / blocks)))


def qmm(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, *, bits: int, group_size: int) -> mx.array:
    """``x @ dequantize(weight).T`` for x of at most `MAX_ROWS` rows (leading axes flattened).

    Args:
        x: (..., K) bfloat16 or float16.
        weight: (N, K * bits / 32) uint32, MLX's affine packing.
        scales, biases: (N, K / group_size) in x's dtype.

    Returns:
        (..., N) in x's dtype.
    """
    k, n = x.shape[-1], weight.shape[0]
    rows = x.size // k
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"qmm takes 1..{MAX_ROWS} rows, got {rows}")
    tiles = -(-rows // 16) * 2  # input rows padded to 16 (n8 tiles in pairs): four compiled sizes
    parts = splits(n, k, bits)
    out_dtype = x.dtype if parts == 1 else mx.float32
    y = _kernel()(
        inputs=[x.reshape(rows, k), weight, scales, biases, cuda_backend.int32s(rows)],
        template=[("T", x.dtype), ("O", out_dtype), ("BITS", bits), ("GS", group_size), ("K", k), ("N", n),
                  ("MT", tiles)],
        grid=(-(-n // (WARPS * FEATURES_PER_WARP)) * 32 * WARPS, parts, 1), threadgroup=(32 * WARPS, 1, 1),
        output_shapes=[(parts, rows, n)], output_dtypes=[out_dtype])[0]
    y = y[0] if parts == 1 else mx.sum(y, axis=0).astype(x.dtype)
    return y.reshape(*x.shape[:-1], n)


def linear_product(linear: Any, x: mx.array) -> mx.array:
    """`linear(x)` through `qmm` (the caller checked `takes` and the row count)."""
    y = qmm(x, linear["weight"], linear["scales"], linear["biases"], bits=linear.bits, group_size=linear.group_size)
    return y + linear["bias"] if "bias" in linear else y
