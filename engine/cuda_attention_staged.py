"""One-query attention over an 8-bit KV cache, its bytes staged through shared memory (MLX's CUDA backend, decode).

`engine.cuda_attention_mma` read 2.1 TB/s over 131,072 keys on the H200 (0.136 ms a call; 0.157 in the
fifth session; docs/benchmarks.md), and with it an 8-bit decode step took as long as a bf16 one.
Compiled for sm_90 it holds 233 registers a thread, so 8 warps fit on a multiprocessor, each
with one tile of about 4 KB in flight; and its loop spends 891 instructions on a tile of 16 keys,
most of them making bf16 out of bytes and addresses (docs/benchmarks.md, twelfth session, says how
these were counted). This kernel keeps that one's arithmetic and
fragment layouts and changes two things:

- the bytes: each warp copies its tiles into its own ring of `STAGES` shared-memory buffers with
  ``cp.async`` (`STAGES - 1` tiles in flight, no registers held for them), rows swizzled in 16-byte
  chunks so that the fragment reads meet no bank conflicts (keys: chunk ^ 4 on odd rows; values:
  chunk ^ (row & 6));
- the products: float16 `mma.sync` (m16n8k16, float32 accumulation) instead of bf16, because a
  byte ``b`` becomes the float16 ``1024 + b`` with one byte permute (``0x64`` above it): for the
  scores the 1,024 is taken out after the product (``q.(1024 + b) = q.b + 1024 sum(q)``, folded
  into the bias term), for the values before it (one half-precision subtract per pair, exact).
  The queries are bf16 values, exact in float16 inside its range; the value operand is
  ``p * scale * 256`` (p <= 1; the scale clamped to float16's finite range), and the 256 is taken
  out of the output: float16's 11 bits carry it where bf16 carried 8;
- a tile rescales the running output only where some head's running max moved.

Only for D = 128, groups of 64 and G <= 16 query heads per KV head, like the bf16 kernel; the
engine measures it against that one and MLX's (`engine.decode_measure`) and takes the fastest
that agrees with MLX. Layout assumptions are that kernel's (rows 16-byte aligned, each key's two
scales adjacent); the partial outputs are its layout too, folded by its `merge`.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_attention_fragments as fragments
from engine import cuda_backend
from engine.cuda_attention_fragments import EPILOGUE, QUERIES, SOFTMAX

WARPS = 4  # per block; each warp is one split of the keys
STAGES = 4  # shared-memory buffers per warp: STAGES - 1 tiles in flight (bench/gpu_attention.py tries others)
TILE = 16
STAGE_BYTES = 2 * TILE * 128 + 4 * TILE * 4  # key rows, value rows, four scale words per key
BLOCKS_PER_MULTIPROCESSOR = 3
TARGET_WARPS = BLOCKS_PER_MULTIPROCESSOR * WARPS * 132
"""Warps in all at long contexts: three blocks of four on each of the H200's 132 multiprocessors, one wave
(a block holds 70 KB of shared memory and 167 registers a thread, compiled for sm_90: three fit)."""

HEADER = fragments.HEADER + r"""
namespace codectx {
// `x` clamped to float16's finite range.
__device__ __forceinline__ float finite16(float x) { return fminf(fmaxf(x, -65504.f), 65504.f); }
// a - b per f16 half.
__device__ __forceinline__ uint32_t hsub2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// d += a * b: m16n8k16, f16 inputs, float32 accumulators.
__device__ __forceinline__ void mma16816h(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
}  // namespace codectx
"""

RING = r"""
  const int tiles = begin < end ? (end - begin + 15) >> 4 : 0;
  unsigned char* ring = smem + (size_t)warp * STAGES * STAGE;
  const uint32_t ring_addr = static_cast<uint32_t>(__cvta_generic_to_shared(ring));

  const size_t kq0 = kvh * kq_strides[1], ks0 = kvh * ks_strides[1], kb0 = kvh * kb_strides[1];
  const size_t vq0 = kvh * vq_strides[1], vs0 = kvh * vs_strides[1], vb0 = kvh * vb_strides[1];
  const unsigned char* kbytes = reinterpret_cast<const unsigned char*>(kq + kq0);
  const unsigned char* vbytes = reinterpret_cast<const unsigned char*>(vq + vq0);
  const size_t krow = kq_strides[2] * 4, vrow = vq_strides[2] * 4;  // bytes
  // The scale words this lane copies: lanes 0-15 the key scales' then the value scales', lanes 16-31 the
  // key biases' then the value biases' (one word, both groups, per key; strides in words).
  const bool low = lane < 16;
  const uint32_t* key_words = reinterpret_cast<const uint32_t*>(low ? ks + ks0 : kb + kb0);
  const uint32_t* value_words = reinterpret_cast<const uint32_t*>(low ? vs + vs0 : vb + vb0);
  const size_t key_word_row = (low ? ks_strides[2] : kb_strides[2]) / 2;
  const size_t value_word_row = (low ? vs_strides[2] : vb_strides[2]) / 2;
  // This lane's 16-byte chunk `ch` of rows 4 i + rr (i = 0..3) of a tile's keys and values, and where the
  // chunk lands in a stage: rows of 128 bytes, keys' chunks ^ 4 on odd rows, values' ^ (row & 6), which for
  // row 4 i + rr is (rr & 2), ^ 4 on odd i.
  const int rr = lane >> 3, ch = lane & 7;
  const uint32_t key_dst = rr * 128 + ((ch ^ ((rr & 1) << 2)) << 4);
  const uint32_t value_dst0 = 2048 + rr * 128 + ((ch ^ (rr & 2)) << 4);
  const uint32_t value_dst1 = 2048 + rr * 128 + ((ch ^ (rr & 2) ^ 4) << 4);
  const uint32_t krow4 = 4 * krow, vrow4 = 4 * vrow;
  const int word_key = lane & 15, which = lane >> 4;  // words [0, 16): key scales, [16, 32): key biases, ...
  // Whole tiles are issued in order from `begin`: this lane's sources in the next one as offsets from a KV
  // head's rows (32 bits: a head's rows span less than 4 GB), advanced a tile a call.
  uint32_t knext = (begin + rr) * krow + ch * 16, vnext = (begin + rr) * vrow + ch * 16;
  uint32_t key_word_next = (begin + word_key) * key_word_row, value_word_next = (begin + word_key) * value_word_row;

  // A tile's copies into stage `st`: key and value rows (4 chunks of 16 bytes a lane each), then the
  // four scale words of its 16 keys (2 a lane). Rows past the warp's end (its last tile only) are copied
  // from its last row (finite) and masked by the caller. Called for the warp's tiles in order.
  auto issue = [&](int tile, int st) {
    const uint32_t base = ring_addr + st * STAGE;
    if (WHOLE_TILES && tile + 16 <= end) {  // a whole tile: each row's address one stride from the last
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        codectx::cp_async16(base + key_dst + i * 512, kbytes + (knext + i * krow4));
        codectx::cp_async16(base + (i & 1 ? value_dst1 : value_dst0) + i * 512, vbytes + (vnext + i * vrow4));
      }
      codectx::cp_async4(base + 4096 + which * 64 + word_key * 4, key_words + key_word_next);
      codectx::cp_async4(base + 4096 + (2 + which) * 64 + word_key * 4, value_words + value_word_next);
      knext += 4 * krow4;
      vnext += 4 * vrow4;
      key_word_next += 16 * key_word_row;
      value_word_next += 16 * value_word_row;
      return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = i * 32 + lane, row = idx >> 3, chunk = idx & 7;
      const size_t key = (size_t)min(tile + row, end - 1);
      codectx::cp_async16(base + row * 128 + ((chunk ^ ((row & 1) << 2)) << 4), kbytes + key * krow + chunk * 16);
      codectx::cp_async16(base + 2048 + row * 128 + ((chunk ^ (row & 6)) << 4), vbytes + key * vrow + chunk * 16);
    }
    const size_t key = (size_t)min(tile + word_key, end - 1);
    codectx::cp_async4(base + 4096 + which * 64 + word_key * 4, key_words + key * key_word_row);
    codectx::cp_async4(base + 4096 + (2 + which) * 64 + word_key * 4, value_words + key * value_word_row);
  };
"""
"""A warp's ring of `STAGES` shared-memory stages and `issue`, the copies of one tile into a stage (the
staged kernels' shared layout: key rows, value rows, then four scale words a key). ``WHOLE_TILES`` (each
kernel's constant): a whole tile's sources are offsets advanced a tile a call, not computed per row (fewer
instructions a tile, about ten more registers)."""

TILES = r"""#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < tiles) issue(begin + 16 * s, s);
    codectx::cp_async_commit();
  }
  for (int t = 0; t < tiles; ++t) {
    codectx::cp_async_wait<STAGES - 2>();  // this lane's copies of tile t have landed
    __syncwarp();                          // and every lane's; all are done with tile t - 1's stage
    if (t + STAGES - 1 < tiles) issue(begin + 16 * (t + STAGES - 1), (t + STAGES - 1) % STAGES);
    codectx::cp_async_commit();
    const int tile = begin + 16 * t;
    const unsigned char* st = ring + (t % STAGES) * STAGE;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(st + 4096);
"""
"""The ring's first `STAGES - 1` tiles issued, then the loop over the warp's tiles opened: tile `t` landed,
the next issued, ``tile`` (its first key), ``st`` (its stage) and ``words`` (its scale words) named; the kernel's
body follows and closes the loop."""

SOURCE = r"""
  // D = 128, two groups of 64; lane = 4 r + c. Fragments as in the bf16 kernel: score fragments head r
  // (and r + 8), keys 2c, 2c+1, 2c+8, 2c+9 of the tile (j = 0..3); value fragments the same keys,
  // dimensions g*64 + 8r + i (i = 0..7).
  constexpr int STAGE = 2 * 16 * 128 + 4 * 16 * 4;
  constexpr float VSCALE = 256.f;
  constexpr float OUT_SCALE = 1.f / VSCALE;
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr bool F16 = true;  // the products take float16
  constexpr bool WHOLE_TILES = false;  // 179 registers with, past three blocks a multiprocessor
""" + QUERIES + RING + r"""
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, bacc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  float oacc[2][8][4];
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[g][i][e] = 0.f;

""" + TILES + r"""
    float ksc[4][2], kbi[4][2], vsc[4][2], vbi[4][2];
    bool valid[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = (j >> 1) * 8 + 2 * c + (j & 1);
      valid[j] = tile + k < end;
      const uint32_t ksw = words[k], kbw = words[16 + k], vsw = words[32 + k], vbw = words[48 + k];
      ksc[j][0] = codectx::lo_f<T>(ksw);
      ksc[j][1] = codectx::hi_f<T>(ksw);
      kbi[j][0] = codectx::lo_f<T>(kbw) - 1024.f * ksc[j][0];  // the bytes enter as 1024 + b
      kbi[j][1] = codectx::hi_f<T>(kbw) - 1024.f * ksc[j][1];
      // (p <= 1: the value operand p * vsc is finite in float16 where vsc is)
      vsc[j][0] = valid[j] ? codectx::finite16(codectx::lo_f<T>(vsw) * VSCALE) : 0.f;
      vsc[j][1] = valid[j] ? codectx::finite16(codectx::hi_f<T>(vsw) * VSCALE) : 0.f;
      vbi[j][0] = valid[j] ? codectx::lo_f<T>(vbw) : 0.f;
      vbi[j][1] = valid[j] ? codectx::hi_f<T>(vbw) : 0.f;
    }

    // Scores, one accumulator per group and key half-tile: B = 1024 + the key's bytes (f16).
    float sacc[2][2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int row = nt * 8 + r;
      const uint4* krow4 = reinterpret_cast<const uint4*>(st + row * 128);
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        const uint4 kw = krow4[(g * 4 + c) ^ ((row & 1) << 2)];
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[g][nt][e] = 0.f;
#pragma unroll
        for (int t4 = 0; t4 < 4; ++t4) {
          const uint32_t w = t4 == 0 ? kw.x : t4 == 1 ? kw.y : t4 == 2 ? kw.z : kw.w;
          codectx::mma16816h(sacc[g][nt], qa[g][t4][0][0], qa[g][t4][1][0], qa[g][t4][0][1], qa[g][t4][1][1],
                             codectx::prmt(w, 0x64646464u, 0x4140u), codectx::prmt(w, 0x64646464u, 0x4342u));
        }
      }
    }

""" + SOFTMAX + r"""
    // Values: A = p * value scale * VSCALE (f16, clamped finite), B = the value bytes (f16, exact);
    // dims g*64 + 8 * column + i. A key pair's bytes of dims s and s + 1 in one permute, then each
    // dimension's pair with 0x64 above its bytes, less 1024.
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const uint32_t a0 = codectx::h2(p[0][0] * vsc[0][g], p[0][1] * vsc[1][g]);
      const uint32_t a1 = codectx::h2(p[1][0] * vsc[0][g], p[1][1] * vsc[1][g]);
      const uint32_t a2 = codectx::h2(p[0][2] * vsc[2][g], p[0][3] * vsc[3][g]);
      const uint32_t a3 = codectx::h2(p[1][2] * vsc[2][g], p[1][3] * vsc[3][g]);
      uint2 vw[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = (j >> 1) * 8 + 2 * c + (j & 1);
        const int chunk = (g * 4 + (r >> 1)) ^ (row & 6);
        vw[j] = *reinterpret_cast<const uint2*>(st + 2048 + row * 128 + chunk * 16 + (r & 1) * 8);
      }
#pragma unroll
      for (int word = 0; word < 2; ++word)
#pragma unroll
        for (int s2 = 0; s2 < 4; s2 += 2) {
          const uint32_t w0 = word ? vw[0].y : vw[0].x, w1 = word ? vw[1].y : vw[1].x;
          const uint32_t w2 = word ? vw[2].y : vw[2].x, w3 = word ? vw[3].y : vw[3].x;
          const uint32_t sel = s2 | ((4 + s2) << 4) | ((s2 + 1) << 8) | ((5 + s2) << 12);
          const uint32_t lo = codectx::prmt(w0, w1, sel), hi = codectx::prmt(w2, w3, sel);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const uint32_t pick = e ? 0x4342u : 0x4140u;
            const uint32_t b0 = codectx::hsub2(codectx::prmt(lo, 0x64646464u, pick), 0x64006400u);
            const uint32_t b1 = codectx::hsub2(codectx::prmt(hi, 0x64646464u, pick), 0x64006400u);
            codectx::mma16816h(oacc[g][word * 4 + s2 + e], a0, a1, a2, a3, b0, b1);
          }
        }
    }
  }

""" + EPILOGUE


def ring_kernel(name: str, source: str, header: str, stages: int, min_blocks: int = 0) -> Any:
    """A kernel with the staged attentions' inputs and outputs and `stages` ring stages of shared memory for each
    of a block's `WARPS` warps; `min_blocks`: the compiler holds its registers to that many blocks a
    multiprocessor (launch bounds: MLX writes the kernel's declaration after our header, so the header gives
    ``__global__`` the bounds)."""
    if min_blocks:
        header += (f"\n#undef __global__\n#define __global__ __attribute__((global)) "
                   f"__launch_bounds__({WARPS * 32}, {min_blocks})\n")
    return cuda_backend.kernel(
        name, source, header, input_names=["q", "kq", "ks", "kb", "vq", "vs", "vb", "meta", "qscale_in", "after"],
        output_names=["part_out", "part_ml"], ensure_row_contiguous=False,
        shared_memory=WARPS * stages * STAGE_BYTES)


@functools.lru_cache(maxsize=4)
def _kernel(stages: int = STAGES) -> Any:
    return ring_kernel("codectx_q8_attention_staged", SOURCE, HEADER, stages)


def split_size(n: int, kv_heads: int, target_warps: int = TARGET_WARPS) -> int:
    """Keys per warp: a multiple of the tile giving at most `target_warps` warps in all, at least 128 (each
    split's partial output is read back by the merge). A KV head's warps are a whole number of blocks, so
    that the blocks of all heads stay within the one wave `TARGET_WARPS` is (198 warps a head would round
    up to 50 blocks, 400 in all, four past the wave)."""
    per_head = max(WARPS, target_warps // max(1, kv_heads) // WARPS * WARPS)
    return cuda_backend.split_size(n, kv_heads, per_head * kv_heads, 128, TILE)


def partial_attention(queries: mx.array, keys: tuple, values: tuple, n: int | mx.array, scale: float,
                      after: mx.array | None = None, stages: int = STAGES,
                      target_warps: int = TARGET_WARPS) -> tuple[mx.array, mx.array]:
    """Unnormalized partial outputs and (max, sum) pairs as `engine.cuda_attention_mma.partial_attention` returns
    them (`engine.cuda_attention_fragments.partial_attention`); `stages` and `target_warps`: the engine's
    defaults, other values for the benchmark."""
    return fragments.partial_attention(_kernel(stages), queries, keys, values, n, scale, after,
                                       lambda span, kv_heads: split_size(span, kv_heads, target_warps), WARPS,
                                       (("STAGES", stages),))
