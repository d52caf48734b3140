"""One-query attention over an 8-bit KV cache with the tensor-core products transposed (MLX's CUDA backend,
decode): keys (scores) and dimensions (values) as the 16 rows of each ``mma.sync`` m16n8k16, the query heads
of a KV head as its 8 columns. For models of at most 8 query heads per KV head (Qwen3-32B, Llama 3 70B: 8).

`engine.cuda_attention_staged` puts the query heads on the 16 rows: with 8 heads half of every product and
of its output registers is zeros. Here the same tile of 16 keys takes 8 score products and 8 value products
instead of 16 and 16, the running output is 32 registers a lane instead of 64, and each lane converts the
scales of 2 keys instead of 4. What it costs:
- the probabilities come out of the score product as (key, head) fragments and the value product takes them
  as (head, key): two ``movmatrix`` transposes a group and tile;
- a head's max over a tile is a reduction over 8 lanes (three shuffles) instead of 4 (two).

The bytes travel as in the staged kernel (`engine.cuda_attention_staged.RING`, its shared-memory layout and
swizzles, whole tiles addressed by offsets advanced a tile at a time) and become float16 the same way: a byte
``b`` is ``1024 + b`` after one byte permute. For the scores the 1,024 is folded into the bias term; for the
values it is taken out by one more product a group and tile, of the value operand with rows of 1,024s,
subtracted at the end (the two float32 sums cancel about 1,024 times the operand's sum: their rounding, about
2^-24 of that, is far below the float16 rounding of the operand itself, 2^-11).

Fragments (lane = 4 r + c): scores: keys r and r + 8 of the tile, heads 2c and 2c + 1, the products' k over
dimensions g*64 + 16c + 4j + {0..3} (the queries' layout in `engine.cuda_attention_fragments.QUERIES`);
values: dimensions g*64 + 8r + {2j, 2j + 1} of the value block 4g + j, heads 2c and 2c + 1. The partial
outputs are the other tensor-core kernels' layout, folded by `engine.cuda_attention_mma.merge`.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_attention_fragments as fragments
from engine import cuda_attention_staged as staged
from engine.cuda_attention_fragments import QUERIES

WARPS = staged.WARPS  # per block (the ring's): each warp is one split of the keys
STAGES = 4  # shared-memory buffers per warp: STAGES - 1 tiles in flight
MAX_HEADS = 8  # query heads per KV head: the products' 8 columns
FOUR_BLOCKS = (3, 2112, 4)
"""(stages, target warps, min blocks) of the variant with four blocks a multiprocessor, for the benchmark: held to
128 registers by launch bounds it compiles for sm_90 without spilling (a CPU test holds this), and three stages
keep four blocks' shared memory within the 227 KB."""
COMBINE = True
"""Each block folds its warps' partials before writing them (one partial a block for the merge to read back, a
fourth of the bytes), in shared memory once its warps have left their loops. Nsight Compute on an H100 at 131k
keys: the merge of one partial a warp took 6.6 us a layer (run l), 0.43 ms of a 17.8 ms 8-bit step (run n); with
one a block, 0.26 ms (run p; docs/benchmarks.md, seventeenth session)."""
BLOCKS_PER_MULTIPROCESSOR = 2
TARGET_WARPS = BLOCKS_PER_MULTIPROCESSOR * WARPS * 132
"""Warps in all at long contexts: two blocks of four on each of the H200's 132 multiprocessors, one wave. With each
block folding its warps (`COMBINE`), two blocks a multiprocessor ran faster than three at 131,072 keys: 0.097
against 0.104 ms a call with the merge on the H200 (run q). On an H100 it was 0.120 against 0.122 in run o, 0.132
against 0.128 in run r, and 7.50 against 7.52 ms a step inside the traced step (runs r, p): within that card's
noise (docs/benchmarks.md, seventeenth session). Three would fit (a block holds 70 KB of shared memory and, compiled for
sm_90, 152 registers a thread, as a CPU test holds)."""

HEADER = staged.HEADER + r"""
namespace codectx {
// The 8x8 matrix of 16-bit values whose row lane / 4, columns 2 (lane % 4) and + 1 this lane holds, transposed:
// this lane gets the same places of the transpose.
__device__ __forceinline__ uint32_t transpose8(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}
// 2^x in one instruction (exp2f adds a range check around it): relative error about 2^-22, results below
// 2^-126 flushed to zero, which a softmax's weights lose nothing by.
__device__ __forceinline__ float exp2_fast(float x) {
  float d;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(d) : "f"(x));
  return d;
}
}  // namespace codectx
"""

SOURCE = r"""
  constexpr int STAGE = 2 * 16 * 128 + 4 * 16 * 4;
  constexpr float VSCALE = 256.f;
  constexpr float OUT_SCALE = 1.f / VSCALE;
  constexpr uint32_t ONES = 0x64006400u;  // a pair of float16 1,024s
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr bool F16 = true;  // the products take float16
  constexpr bool WHOLE_TILES = true;
""" + QUERIES + staged.RING + r"""
  // The query sums per group of this lane's heads 2c and 2c + 1, from the lanes that hold them (4 x head).
  float hsum[2][2];
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int g = 0; g < 2; ++g) hsum[e][g] = __shfl_sync(0xFFFFFFFFu, qsum[0][g], 8 * c + 4 * e);

  // Per head e (2c + e): running max, sum and value-bias sums (per group); the output per value block
  // (4g + j: rows dims 8r + 2j and + 1, columns heads 2c, 2c + 1) and per group the 1,024s' product.
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, bacc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  float oacc[8][4], ones[2][4];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) oacc[i][e] = 0.f;
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e) ones[g][e] = 0.f;

""" + staged.TILES + r"""
    // Keys r and r + 8 (kk = 0, 1): scales, the bias less the 1,024 the bytes enter with, value scales (times
    // VSCALE, clamped to float16's range) and biases; zero past the warp's end.
    float ksc[2][2], kbi[2][2], vsc[2][2], vbi[2][2];
    bool valid[2];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const int k = r + 8 * kk;
      valid[kk] = tile + k < end;
      const uint32_t ksw = words[k], kbw = words[16 + k], vsw = words[32 + k], vbw = words[48 + k];
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        ksc[kk][g] = g ? codectx::hi_f<T>(ksw) : codectx::lo_f<T>(ksw);
        kbi[kk][g] = (g ? codectx::hi_f<T>(kbw) : codectx::lo_f<T>(kbw)) - 1024.f * ksc[kk][g];
        const float scale = g ? codectx::hi_f<T>(vsw) : codectx::lo_f<T>(vsw);
        vsc[kk][g] = valid[kk] ? codectx::finite16(scale * VSCALE) : 0.f;
        vbi[kk][g] = valid[kk] ? (g ? codectx::hi_f<T>(vbw) : codectx::lo_f<T>(vbw)) : 0.f;
      }
    }

    // Scores: A = 1024 + the bytes of keys r and r + 8 (k: dims g*64 + 16c + 4j + {0..3}), B = the queries.
    float sacc[2][4];
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const uint4 k0 = reinterpret_cast<const uint4*>(st + r * 128)[(g * 4 + c) ^ ((r & 1) << 2)];
      const uint4 k1 = reinterpret_cast<const uint4*>(st + (r + 8) * 128)[(g * 4 + c) ^ ((r & 1) << 2)];
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[g][e] = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t w0 = j == 0 ? k0.x : j == 1 ? k0.y : j == 2 ? k0.z : k0.w;
        const uint32_t w1 = j == 0 ? k1.x : j == 1 ? k1.y : j == 2 ? k1.z : k1.w;
        codectx::mma16816h(sacc[g], codectx::prmt(w0, 0x64646464u, 0x4140u), codectx::prmt(w1, 0x64646464u, 0x4140u),
                           codectx::prmt(w0, 0x64646464u, 0x4342u), codectx::prmt(w1, 0x64646464u, 0x4342u),
                           qa[g][j][0][0], qa[g][j][0][1]);
      }
    }

    // Online softmax per head e; the max over the tile's keys across the 8 lanes of a column (r).
    float p[2][2], alpha[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float s[2];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
        s[kk] = valid[kk] ? qscale * (ksc[kk][0] * sacc[0][2 * kk + e] + ksc[kk][1] * sacc[1][2 * kk + e] +
                                      kbi[kk][0] * hsum[e][0] + kbi[kk][1] * hsum[e][1])
                          : -INFINITY;
      float mt = fmaxf(s[0], s[1]);
      mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, 4));
      mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, 8));
      mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, 16));
      const float m_new = fmaxf(m_run[e], mt);
      alpha[e] = codectx::exp2_fast(m_run[e] - m_new);
      m_run[e] = m_new;
      p[0][e] = codectx::exp2_fast(s[0] - m_new);
      p[1][e] = codectx::exp2_fast(s[1] - m_new);
      l_run[e] = fmaf(l_run[e], alpha[e], p[0][e] + p[1][e]);
#pragma unroll
      for (int g = 0; g < 2; ++g)
        bacc[e][g] = fmaf(bacc[e][g], alpha[e], fmaf(p[0][e], vbi[0][g], p[1][e] * vbi[1][g]));
    }
    if (__any_sync(0xFFFFFFFFu, alpha[0] != 1.f || alpha[1] != 1.f)) {  // past the first tiles seldom
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) oacc[i][e] *= alpha[e & 1];
#pragma unroll
      for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int e = 0; e < 4; ++e) ones[g][e] *= alpha[e & 1];
    }

    // Values: B = p * value scale (f16): per group the (key, head) fragments transposed to (head r, keys 2c,
    // 2c + 1 | 2c + 8, 2c + 9). A = 1024 + the value bytes of those keys, dims 8r + 2j (rows r) and + 1 (r + 8).
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const uint32_t b0 = codectx::transpose8(codectx::h2(p[0][0] * vsc[0][g], p[0][1] * vsc[0][g]));
      const uint32_t b1 = codectx::transpose8(codectx::h2(p[1][0] * vsc[1][g], p[1][1] * vsc[1][g]));
      codectx::mma16816h(ones[g], ONES, ONES, ONES, ONES, b0, b1);
      uint2 vw[4];  // keys 2c, 2c + 1, 2c + 8, 2c + 9: dims g*64 + 8r + {0..7}
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = (q >> 1) * 8 + 2 * c + (q & 1);
        const int chunk = (g * 4 + (r >> 1)) ^ (row & 6);
        vw[q] = *reinterpret_cast<const uint2*>(st + 2048 + row * 128 + chunk * 16 + (r & 1) * 8);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int at = 2 * (j & 1);  // the bytes of dims 2j, 2j + 1 in word j / 2
        const uint32_t sel = at | ((4 + at) << 4) | ((at + 1) << 8) | ((5 + at) << 12);
        const uint32_t low = codectx::prmt(j < 2 ? vw[0].x : vw[0].y, j < 2 ? vw[1].x : vw[1].y, sel);
        const uint32_t high = codectx::prmt(j < 2 ? vw[2].x : vw[2].y, j < 2 ? vw[3].x : vw[3].y, sel);
        codectx::mma16816h(oacc[4 * g + j], codectx::prmt(low, 0x64646464u, 0x4140u),
                           codectx::prmt(low, 0x64646464u, 0x4342u), codectx::prmt(high, 0x64646464u, 0x4140u),
                           codectx::prmt(high, 0x64646464u, 0x4342u), b0, b1);
      }
    }
  }

  // Sums over the tile rows each lane took (r), then per head e: dims g*64 + 8r + {0..7}, and the (max, sum).
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int mask = 4; mask < 32; mask <<= 1) {
      l_run[e] += __shfl_xor_sync(0xFFFFFFFFu, l_run[e], mask);
      bacc[e][0] += __shfl_xor_sync(0xFFFFFFFFu, bacc[e][0], mask);
      bacc[e][1] += __shfl_xor_sync(0xFFFFFFFFu, bacc[e][1], mask);
    }
  // COMBINE: the block's warps stage their partials in shared memory (the rings, free once every warp has left
  // its loop) and the block writes one partial: a fourth of the bytes for the merge to read back.
  float* staged_out = reinterpret_cast<float*>(smem);  // [WARPS][G][128], then the (max, sum) pairs
  float* staged_ml = staged_out + WARPS_PER_BLOCK * G * 128;
  if (COMBINE) __syncthreads();
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int head = 2 * c + e;
    if (head >= G) continue;
    const size_t h = (size_t)kvh * G + head;
    float* dst = COMBINE ? staged_out + (warp * G + head) * 128 : part_out + (h * splits + split) * 128;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      float out[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[2 * j] = (oacc[4 * g + j][e] - ones[g][e]) * OUT_SCALE + bacc[e][g];
        out[2 * j + 1] = (oacc[4 * g + j][2 + e] - ones[g][e]) * OUT_SCALE + bacc[e][g];
      }
      float4* to = reinterpret_cast<float4*>(dst + g * 64 + 8 * r);
      to[0] = make_float4(out[0], out[1], out[2], out[3]);
      to[1] = make_float4(out[4], out[5], out[6], out[7]);
    }
    if (r == 0) {
      float* ml = COMBINE ? staged_ml + (warp * G + head) * 2 : part_ml + (h * splits + split) * 2;
      ml[0] = m_run[e];
      ml[1] = l_run[e];
    }
  }
  if (COMBINE) {
    __syncthreads();
    const int block = blockIdx.x, blocks = gridDim.x;
    for (int i = threadIdx.x; i < G * 128; i += blockDim.x) {
      const int head = i >> 7, d = i & 127;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < WARPS_PER_BLOCK; ++w) m = fmaxf(m, staged_ml[(w * G + head) * 2]);
      float o = 0.f, l = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS_PER_BLOCK; ++w) {
        const float mw = staged_ml[(w * G + head) * 2];
        if (mw == -INFINITY) continue;  // a warp without keys
        const float a = exp2f(mw - m);
        o = fmaf(a, staged_out[(w * G + head) * 128 + d], o);
        l = fmaf(a, staged_ml[(w * G + head) * 2 + 1], l);
      }
      const size_t h = (size_t)kvh * G + head;
      part_out[(h * blocks + block) * 128 + d] = o;
      if (d == 0) {
        part_ml[(h * blocks + block) * 2] = m;
        part_ml[(h * blocks + block) * 2 + 1] = l;
      }
    }
  }
"""


@functools.lru_cache(maxsize=4)
def _kernel(stages: int = STAGES, min_blocks: int = 0) -> Any:
    return staged.ring_kernel("codectx_q8_attention_transposed", SOURCE, HEADER, stages, min_blocks)


def shape_problem(G: int, D: int, group_size: int) -> str | None:
    """Why G query heads per KV head of dim D in groups of `group_size` are not this kernel's (None: they are)."""
    if D != 128 or group_size != 64:
        return f"head dim {D}, group {group_size}"
    if G > MAX_HEADS:
        return f"{G} query heads per KV head"
    return None


def split_size(n: int, kv_heads: int, target_warps: int = TARGET_WARPS) -> int:
    """Keys per warp: `engine.cuda_attention_staged.split_size` (blocks of as many warps) for this kernel's wave."""
    return staged.split_size(n, kv_heads, target_warps)


def partial_attention(queries: mx.array, keys: tuple, values: tuple, n: int | mx.array, scale: float,
                      after: mx.array | None = None, stages: int = STAGES, target_warps: int = TARGET_WARPS,
                      min_blocks: int = 0, combine: bool = COMBINE) -> tuple[mx.array, mx.array]:
    """Unnormalized partial outputs and (max, sum) pairs as `engine.cuda_attention_mma.partial_attention` returns
    them, one per block where `combine` (`COMBINE`), else one per warp; `stages`, `target_warps`, `min_blocks`
    (`FOUR_BLOCKS`) and `combine`: the engine's defaults, other values for the benchmark."""
    return fragments.partial_attention(_kernel(stages, min_blocks), queries, keys, values, n, scale, after,
                                       lambda span, kv_heads: split_size(span, kv_heads, target_warps), WARPS,
                                       (("STAGES", stages), ("WARPS_PER_BLOCK", WARPS), ("COMBINE", int(combine))),
                                       per_block=combine)
