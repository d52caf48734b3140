"""An experiment, not in the engine: a quantized matrix product for a few dozen rows on tensor cores (4 or 8 bits),
against MLX's `quantized_matmul` (`bench/gpu_qmm.py`).

Between decode (`engine.cuda_qmv`, at most 8 rows) and a prefill chunk long enough to dequantize each weight for
one dense matmul (`engine.linear_mode`) lie a question's forward (about 45 rows) and a speculative verify (up to
16). There MLX's `quantized_matmul` took about half of a 45-row forward at 131k tokens (84 of 170 ms on the H100
under ncu, docs/benchmarks.md, eighteenth session), several times what reading the weights once costs. On the H100
(runs a-e, docs/benchmarks.md, thirty-third session) this kernel computes what MLX's does (relative error 1.7e-3
against a float32 product, as MLX's) but does not beat it: at 45 rows its best variants tie MLX's (0.61-0.68
against 0.64-0.65 ms a block of Qwen3-32B's seven linears), at 16 rows it loses (0.48-0.51 against 0.34-0.45), and
under ncu a 45-row gate projection read 600 GB/s with 8-12 warps a multiprocessor (184 registers a thread).
So the engine keeps MLX's product there.

This kernel reads each packed weight once, dequantizes it in registers and multiplies on the tensor cores:

- the weight is the product's A operand (16 output rows a ``mma.m16n8k16``), the input rows its B operand
  (8 rows a tile; `TILE_BUCKETS` tiles compiled, other counts padded);
- a warp takes `16 R` output rows over a split of K, chunk by chunk (64 values of K); a block's `KW` warps take
  neighbouring rows over the same chunks, so the input rows one warp reads from L2 the others find in L1 (with
  warps dividing K instead, every block read the whole input: five times the weights' bytes at 45 rows);
  `splits` cuts K into as many splits as keep the device busy, each writing float32 partial sums MLX adds up
  after;
- within a chunk a lane takes values ``16 t .. 16 t + 15`` (t its place in its quad), four at each of the four
  steps: the product sums over K in any order, so the A and B fragments may map any four of them to the columns
  ``2t, 2t+1, 2t+8, 2t+9`` the instruction expects as long as both map the same. A lane then reads its 16 weights
  of a row in one load (8 or 16 bytes; a quad a whole 32- or 64-byte span) and its 16 inputs of a row in two;
- 4-bit values are dequantized two at a time as the instruction takes them, values j and j + 4 of a packed word
  (two nibbles one logic operation apart): their pair ``M + q`` in the activations' type, M taken off exactly,
  and one fused multiply-add with the scale and bias, ``q * scale + bias`` rounded once (MLX's `dequantize`
  rounds the float32 result to the same type: the two differ only where that double rounding does); the inputs
  are paired to match with two byte permutes. 8-bit values take the float32 path of `engine.cuda_dequant`;
- each warp loads its chunks' weights, scales and biases `PREFETCH` chunks ahead of their products; where K is
  not split the block writes the output in the activations' type, else float32 partial sums MLX adds up.

It needs MLX's CUDA backend (`mx.fast.cuda_kernel`); its build for the H200 and a NumPy transliteration of its
lanes are checked on the CPU (tests/engine/test_cuda_qmm.py).
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend
from engine.cuda_attention_fragments import HEADER as FRAGMENTS
from engine.cuda_backend import affine_problem

MAX_ROWS = 64
"""Most input rows one call takes."""
TILE_BUCKETS = (2, 4, 6, 8)
"""Input tiles of 8 rows compiled for (one build per bucket and shape; a count in between is padded, so that a new
question length would not compile in the middle of a request)."""
KW = 4
"""Warps a block: each takes its own output rows over the block's split of K, the block's warps the same chunks at
about the same time, so that the input rows one reads from L2 the others find in L1."""
PREFETCH = 1
"""Chunks a warp has loaded ahead of the one it multiplies (its weights, scales and biases in registers)."""
TARGET_WARPS = 132 * 16
"""Warps a call aims at (16 on each of the H200's and H100's 132 multiprocessors), through `splits`."""

_HEADER = FRAGMENTS + r"""
namespace codectx {
// d += a * b: m16n8k16, f16 inputs, float32 accumulators.
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1, const __half*) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1, const __nv_bfloat16*) {
  mma16816(d, a0, a1, a2, a3, b0, b1);
}
// A 4-bit word's values j and j + 4 (the low nibbles of `bits` and of its upper half) as a packed pair of T,
// ``q * s + b`` rounded once: the pair M + q made by one logic operation with the exponent of M (128 in bf16,
// 1024 in f16, each q exact), M taken off exactly, then one fused multiply-add of the pair with (s, s) and (b, b).
__device__ __forceinline__ uint32_t nibble_pair(uint32_t bits, uint32_t magic) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(bits), "r"(0x000F000Fu), "r"(magic));  // (a & b) | c
  return d;
}
__device__ __forceinline__ uint32_t dequant_pair(uint32_t bits, uint32_t s2, uint32_t b2, const __nv_bfloat16*) {
  const uint32_t m = nibble_pair(bits, 0x43004300u);
  const __nv_bfloat162 q = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&m),
                                   __halves2bfloat162(__ushort_as_bfloat16(0x4300), __ushort_as_bfloat16(0x4300)));
  const __nv_bfloat162 v = __hfma2(q, *reinterpret_cast<const __nv_bfloat162*>(&s2),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b2));
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t dequant_pair(uint32_t bits, uint32_t s2, uint32_t b2, const __half*) {
  const uint32_t m = nibble_pair(bits, 0x64006400u);
  const __half2 q = __hsub2(*reinterpret_cast<const __half2*>(&m),
                            __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400)));
  const __half2 v = __hfma2(q, *reinterpret_cast<const __half2*>(&s2), *reinterpret_cast<const __half2*>(&b2));
  return *reinterpret_cast<const uint32_t*>(&v);
}
// A T's bits twice in a word.
template <typename TT>
__device__ __forceinline__ uint32_t twice(TT v) {
  const uint32_t h = *reinterpret_cast<const unsigned short*>(&v);
  return h | (h << 16);
}
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ uint32_t pack2(float lo, float hi, const __nv_bfloat16*) { return bf2(lo, hi); }
__device__ __forceinline__ uint32_t pack2(float lo, float hi, const __half*) { return h2(lo, hi); }
// The four 8-bit values of a packed word, exact floats.
__device__ __forceinline__ void four(uint32_t word, float (&q)[4]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) q[b] = byte_f(word, b);
}
}  // namespace codectx
"""

_SOURCE = r"""
  constexpr int VPW = 32 / BITS;             // values a packed word
  constexpr int WPR = K / VPW;               // packed words a weight row
  constexpr int WPL = 16 / VPW;              // packed words a lane takes from a row's chunk: 2 or 4
  constexpr int GROUPS = K / GS;
  const int lane = threadIdx.x, warp = threadIdx.y, g = lane >> 2, t = lane & 3;
  const int row0 = (blockIdx.x * KW + warp) * 16 * R, split = blockIdx.y;
  if (row0 >= N) return;
  const int m = meta[0];
  // The lane's weight rows g and g + 8 of each 16 and its input row g of each tile, from the lane's 16 values of a
  // chunk (16t .. 16t + 15).
  const T* xg = x + 16 * t;
  int xo[NT];  // row 8j + g of the input, or its last row for a tile's rows past it (their sums are not stored)
#pragma unroll
  for (int j = 0; j < NT; ++j) xo[j] = min(8 * j + g, m - 1) * K;
  const uint32_t* wg = w + (size_t)(row0 + g) * WPR + WPL * t;
  const T* sg = scales + (size_t)(row0 + g) * GROUPS;
  const T* bg = biases + (size_t)(row0 + g) * GROUPS;

  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.f;

  // Chunks' packed words, scales and biases for the lane's rows, each loaded `PF` of the warp's chunks ahead of
  // its products: slot p holds the chunk the inner loop's p-th pass multiplies (a compile-time index).
  uint32_t wq[PF][R][2][WPL];
  T sc[PF][R][2], bi[PF][R][2];
  auto load = [&](int c, int p) {
    const int gi = (c * 64 + 16 * t) / GS;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t* src = wg + (16 * r + 8 * h) * WPR + c * (64 / VPW);
        if constexpr (WPL == 2) {
          const uint2 v = *reinterpret_cast<const uint2*>(src);
          wq[p][r][h][0] = v.x; wq[p][r][h][1] = v.y;
        } else {
          const uint4 v = *reinterpret_cast<const uint4*>(src);
          wq[p][r][h][0] = v.x; wq[p][r][h][1] = v.y; wq[p][r][h][2] = v.z; wq[p][r][h][3] = v.w;
        }
        sc[p][r][h] = sg[(16 * r + 8 * h) * GROUPS + gi];
        bi[p][r][h] = bg[(16 * r + 8 * h) * GROUPS + gi];
      }
  };
  const int first = split * CPS, end = (split + 1) * CPS;
#pragma unroll
  for (int p = 0; p < PF; ++p)
    if (first + p < end) load(first + p, p);
  for (int base = first; base < end; base += PF)
#pragma unroll
  for (int p = 0; p < PF; ++p) {
    const int c = base + p;
    if (c >= end) break;
    uint32_t cw[R][2][WPL], s2[R][2], b2[R][2];
    T cs[R][2], cb[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < WPL; ++i) cw[r][h][i] = wq[p][r][h][i];
        cs[r][h] = sc[p][r][h];
        cb[r][h] = bi[p][r][h];
        s2[r][h] = codectx::twice(cs[r][h]);
        b2[r][h] = codectx::twice(cb[r][h]);
      }
    if (c + PF < end) load(c + PF, p);
    uint4 xv[NT];  // loaded at steps 0 and 2: the lane's 8 values of each tile's row g those two steps take
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if ((s & 1) == 0) {
#pragma unroll
        for (int j = 0; j < NT; ++j) xv[j] = reinterpret_cast<const uint4*>(xg + xo[j] + c * 64)[s >> 1];
      }
      uint32_t a[R][4];
      if constexpr (BITS == 4) {  // values (j, j + 4) of word s >> 1 as pairs, j = 2 (s & 1) and j + 1
        const int j = 2 * (s & 1);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t word = cw[r][h][s >> 1];
            a[r][h] = codectx::dequant_pair(word >> (4 * j), s2[r][h], b2[r][h], x);  // columns 2t, 2t+1
            a[r][2 + h] = codectx::dequant_pair(word >> (4 * j + 4), s2[r][h], b2[r][h], x);  // 2t+8, 2t+9
          }
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float v[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float q[4];
            codectx::four(cw[r][h][s], q);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              v[h][i] = fmaf(q[i], static_cast<float>(cs[r][h]), static_cast<float>(cb[r][h]));
          }
          a[r][0] = codectx::pack2(v[0][0], v[0][1], x);  // rows g, g + 8; columns 2t, 2t+1, then 2t+8, 2t+9
          a[r][1] = codectx::pack2(v[1][0], v[1][1], x);
          a[r][2] = codectx::pack2(v[0][2], v[0][3], x);
          a[r][3] = codectx::pack2(v[1][2], v[1][3], x);
        }
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 xw = xv[j];  // the input's values 4s .. 4s + 3 of the lane's 16
        uint32_t b0 = s & 1 ? xw.z : xw.x, b1 = s & 1 ? xw.w : xw.y;
        if constexpr (BITS == 4) {  // (x_j, x_j+4) and (x_j+1, x_j+5) of the 8 in xw, as the A pairs take them
          const uint32_t lo = s & 1 ? xw.y : xw.x, hi = s & 1 ? xw.w : xw.z;
          b0 = codectx::prmt(lo, hi, 0x5410u);
          b1 = codectx::prmt(lo, hi, 0x7632u);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) codectx::mma16816(acc[r][j], a[r][0], a[r][1], a[r][2], a[r][3], b0, b1, x);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // rows g, g + 8; input rows 2t, 2t + 1 of the tile
        const int row = row0 + 16 * r + g + (e >> 1) * 8, token = 8 * j + 2 * t + (e & 1);
        if (token < m) codectx::store(y + ((size_t)split * m + token) * N + row, acc[r][j][e]);  // T if K is whole
      }
"""


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_qmm", _SOURCE, _HEADER, input_names=["x", "w", "scales", "biases", "meta"],
                               output_names=["y"])


def tiles(rows: int) -> int:
    """The smallest of `TILE_BUCKETS` whose tiles of 8 hold `rows` (raises past `MAX_ROWS`)."""
    for bucket in TILE_BUCKETS:
        if 8 * bucket >= rows:
            return bucket
    raise ValueError(f"qmm takes at most {MAX_ROWS} rows, got {rows}")


ROW_SETS: int | None = None
"""Sets of 16 output rows a warp takes, where set (a benchmark's variant); None: `rows_per_warp`'s rule."""


def rows_per_warp(n: int, tile_count: int) -> int:
    """Sets of 16 output rows a warp takes: as many as keep its accumulators at 48 floats a lane where `n` divides
    (each input fragment it loads used that often, each chunk's loads that much larger), else 1. (At 64, four sets
    of 8-bit rows over four tiles spilled registers.)"""
    if ROW_SETS is not None and n % (16 * ROW_SETS) == 0:
        return ROW_SETS
    for sets in (4, 2):
        if sets * tile_count <= 12 and n % (16 * sets) == 0:
            return sets
    return 1


def splits(n: int, k: int, bits: int, tile_count: int) -> int:
    """How many parts K is cut into: the fewest that give `TARGET_WARPS` warps, each part a whole number of chunks,
    the float32 partial sums (parts x rows x n) at most half the packed weight's bytes (1: no partial sums, the
    block writes the output)."""
    chunks, warps = k // 64, n // (16 * rows_per_warp(n, tile_count))
    most = max(1, min(chunks, k * bits // (16 * 4 * 8 * tile_count)))
    candidates = [s for s in range(1, most + 1) if chunks % s == 0]
    return next((s for s in candidates if warps * s >= TARGET_WARPS), candidates[-1])


def unsupported(linear: Any, dtype: mx.Dtype) -> str | None:
    """Why this kernel cannot multiply `linear` for activations of `dtype` (None: it can)."""
    weight = linear["weight"]
    return _problem(getattr(linear, "mode", "affine"), linear.bits, linear.group_size, weight.ndim,
                    weight.shape[0], weight.shape[-1] * 32 // linear.bits, linear.get("biases") is not None, dtype,
                    str(mx.default_device()))


@functools.lru_cache(maxsize=None)
def _problem(mode: str, bits: int, group_size: int, ndim: int, n: int, k: int, biases: bool, dtype: mx.Dtype,
             device: str) -> str | None:
    problem = affine_problem(mode, bits, dtype, biases)
    if problem is None and (group_size not in (32, 64, 128) or k % 64 or k % group_size or ndim != 2 or n % 16):
        return f"group size {group_size}, {n} x {k}"
    return problem


def qmm(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, *, bits: int,
        group_size: int) -> mx.array:
    """``x @ dequantize(weight).T`` for x (..., K), bfloat16 or float16, of at most `MAX_ROWS` rows (leading axes
    flattened); weight (N, K * bits / 32) uint32 in MLX's affine packing, scales and biases (N, K / group_size)
    in x's dtype. Returns (..., N) in x's dtype."""
    k, n = x.shape[-1], weight.shape[0]
    rows = x.size // k
    tile_count = tiles(rows)
    r, parts = rows_per_warp(n, tile_count), splits(n, k, bits, tile_count)
    out = _kernel()(
        inputs=[x.reshape(rows, k), weight, scales, biases, cuda_backend.int32s(rows)],
        template=[("T", x.dtype), ("BITS", bits), ("GS", group_size), ("K", k), ("N", n), ("NT", tile_count),
                  ("R", r), ("KW", KW), ("CPS", k // 64 // parts), ("PF", PREFETCH)],
        grid=(32 * -(-n // (16 * r * KW)), KW * parts, 1), threadgroup=(32, KW, 1),
        output_shapes=[(*x.shape[:-1], n) if parts == 1 else (parts, rows, n)],
        output_dtypes=[x.dtype if parts == 1 else mx.float32])[0]
    return out if parts == 1 else out.sum(axis=0).astype(x.dtype).reshape(*x.shape[:-1], n)


def linear_product(linear: Any, x: mx.array) -> mx.array:
    """`linear(x)` through `qmm` (the caller checked `unsupported`), plus the linear's bias where it has one."""
    y = qmm(x, linear["weight"], linear["scales"], linear["biases"], bits=linear.bits, group_size=linear.group_size)
    return y + linear["bias"] if "bias" in linear else y
