"""Device code the tensor-core attention kernels share (`engine.cuda_attention_mma`, `engine.cuda_attention_staged`,
and the header of `engine.cuda_chunk_attention`): the ``mma.sync`` wrappers and conversions, and the pieces of a
split-key one-query kernel written against one fragment layout (lane = 4 r + c; score fragments head r and r + 8,
keys 2c, 2c+1, 2c+8, 2c+9 of a 16-key tile; value fragments those keys, dimensions g*64 + 8r + i): the queries as
the score product's A operand, the online softmax of a tile, and the partial outputs written. Each kernel's body
defines the constants the pieces read (``F16``, ``OUT_SCALE``) and the names they share (``sacc``, ``ksc``,
``kbi``, ``vbi``, ``valid``, ``oacc``, ...). `partial_attention` launches such a kernel.
"""
from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx

from engine import cuda_backend
from engine.cuda_backend import PRMT_HEADER

HEADER = PRMT_HEADER + r"""
namespace codectx {
// Two floats as bf16x2, `lo` in the low half.
__device__ __forceinline__ uint32_t bf2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// Two floats as an f16x2 word, `lo` in the low half.
__device__ __forceinline__ uint32_t h2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// The low and high 16-bit halves of `w` as floats, each a T (bf16 or fp16).
template <typename T>
__device__ __forceinline__ float lo_f(uint32_t w) {
  const unsigned short b = w & 0xFFFFu;
  return static_cast<float>(*reinterpret_cast<const T*>(&b));
}
template <typename T>
__device__ __forceinline__ float hi_f(uint32_t w) {
  const unsigned short b = w >> 16;
  return static_cast<float>(*reinterpret_cast<const T*>(&b));
}
// d += a * b: m16n8k16, bf16 inputs, float32 accumulators.
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
}  // namespace codectx
"""

QUERIES = r"""
  constexpr bool HI = G > 8;
  const int kvh = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
  const int split = blockIdx.x * (blockDim.x >> 5) + warp, splits = gridDim.x * (blockDim.x >> 5);
  const int n = meta[0], cs = meta[1];
  const float qscale = qscale_in[0];
  const int begin = split * cs, end = min(n, begin + cs);

  // Queries: lane (r, c) holds dims g*64 + 16c + 4t + {0..3} of heads r and r + 8 (pairs of the products'
  // input type: float16 where F16, else bf16), and each head's sum per group.
  uint32_t qa[2][4][2][2];
  float qsum[2][2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int head = half * 8 + r;
    const bool live = (half == 0 || HI) && head < G;
    const uint2* qh = reinterpret_cast<const uint2*>(q) + (size_t)(kvh * G + (live ? head : 0)) * 32;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      float s = 0.f;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const uint2 w = live ? qh[g * 16 + 4 * c + t] : make_uint2(0u, 0u);
        const float x0 = __uint_as_float(w.x << 16), x1 = __uint_as_float(w.x & 0xFFFF0000u);
        const float x2 = __uint_as_float(w.y << 16), x3 = __uint_as_float(w.y & 0xFFFF0000u);
        qa[g][t][half][0] = F16 ? codectx::h2(x0, x1) : w.x;
        qa[g][t][half][1] = F16 ? codectx::h2(x2, x3) : w.y;
        s += (x0 + x1) + (x2 + x3);
      }
      s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
      s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);
      qsum[half][g] = s;
    }
  }

"""
"""The tensor-core kernels' start: which warp and keys, and the queries as the score product's A
operand (``F16``: each kernel's constant)."""

SOFTMAX = r"""
    // Online softmax per head (r, and r + 8 when G > 8); l and the value-bias sums stay per lane.
    float p[2][4];
#pragma unroll
    for (int half = 0; half < (HI ? 2 : 1); ++half) {
      float s[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float* acc0 = sacc[0][j >> 1];
        const float* acc1 = sacc[1][j >> 1];
        const int e = half * 2 + (j & 1);
        s[j] = valid[j] ? qscale * (ksc[j][0] * acc0[e] + ksc[j][1] * acc1[e] + kbi[j][0] * qsum[half][0] +
                                    kbi[j][1] * qsum[half][1])
                        : -INFINITY;
      }
      float mt = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
      mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, 2));
      const float m_new = fmaxf(m_run[half], mt);
      const float alpha = exp2f(m_run[half] - m_new);
      m_run[half] = m_new;
      float psum = 0.f, b0 = 0.f, b1 = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        p[half][j] = exp2f(s[j] - m_new);
        psum += p[half][j];
        b0 = fmaf(p[half][j], vbi[j][0], b0);
        b1 = fmaf(p[half][j], vbi[j][1], b1);
      }
      l_run[half] = fmaf(l_run[half], alpha, psum);
      bacc[half][0] = fmaf(bacc[half][0], alpha, b0);
      bacc[half][1] = fmaf(bacc[half][1], alpha, b1);
      if (__any_sync(0xFFFFFFFFu, alpha != 1.f)) {  // past the first tiles a head's max seldom moves
#pragma unroll
        for (int g = 0; g < 2; ++g)
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            oacc[g][i][half * 2] *= alpha;
            oacc[g][i][half * 2 + 1] *= alpha;
          }
      }
    }
    if (!HI) {
#pragma unroll
      for (int j = 0; j < 4; ++j) p[1][j] = 0.f;
    }
"""
"""The online softmax of a tile's scores, shared by the tensor-core kernels (here and
`engine.cuda_attention_staged`): per head (r, and r + 8 when G > 8) the running max, sum and value-bias
sums; the running output rescaled only where some head's max moved."""

EPILOGUE = r"""
  // Per lane l and value-bias sums over the keys of its column pair: sum over c.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l_run[half] += __shfl_xor_sync(0xFFFFFFFFu, l_run[half], 1);
    l_run[half] += __shfl_xor_sync(0xFFFFFFFFu, l_run[half], 2);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      bacc[half][g] += __shfl_xor_sync(0xFFFFFFFFu, bacc[half][g], 1);
      bacc[half][g] += __shfl_xor_sync(0xFFFFFFFFu, bacc[half][g], 2);
    }
  }
#pragma unroll
  for (int half = 0; half < (HI ? 2 : 1); ++half) {
    const int head = half * 8 + r;
    if (head >= G) continue;
    const size_t h = (size_t)kvh * G + head;
    float* dst = part_out + (h * splits + split) * 128;
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dst[g * 64 + 8 * (2 * c) + i] = oacc[g][i][half * 2] * OUT_SCALE + bacc[half][g];
        dst[g * 64 + 8 * (2 * c + 1) + i] = oacc[g][i][half * 2 + 1] * OUT_SCALE + bacc[half][g];
      }
    if (c == 0) {
      part_ml[(h * splits + split) * 2] = m_run[half];
      part_ml[(h * splits + split) * 2 + 1] = l_run[half];
    }
  }
"""
"""The tensor-core kernels' partial outputs written: ``OUT_SCALE`` (each kernel's constant) times the
value product plus the value-bias sums, and each split's (max, sum)."""


def partial_attention(kernel: Any, queries: mx.array, keys: tuple, values: tuple, n: int | mx.array, scale: float,
                      after: mx.array | None, split_size: Callable[[int, int], int], warps: int,
                      template: tuple = (), per_block: bool = False) -> tuple[mx.array, mx.array]:
    """One launch of a split-key kernel written with these pieces (inputs ``q, kq, ks, kb, vq, vs, vb, meta,
    qscale_in, after``): blocks of `warps` warps, each warp a split of `split_size(span, kv_heads)` keys.
    Returns unnormalized partial outputs (H, splits, 128) and (max, sum) pairs (H, splits, 2) in base 2, which
    `engine.cuda_attention_mma.merge` folds; `n` as an array splits over the buffers' capacity
    (`engine.cuda_attention.decode_attention`); `after`: an array the kernel must run after, unread;
    `template`: the kernel's own constants beside the scales' dtype and the query heads per KV head; `per_block`:
    the kernel writes one partial a block (its warps folded), not one a warp."""
    B, H, L, D = queries.shape
    if B != 1 or L != 1:
        raise ValueError(f"one query of one sequence, got {B} x {L}")
    kv_heads = keys[0].shape[1]
    span = cuda_backend.split_span(n, keys[0].shape[2])
    cs = split_size(span, kv_heads)
    blocks = -(-(-(-span // cs)) // warps)
    splits = blocks if per_block else blocks * warps
    q = mx.contiguous(queries.astype(mx.bfloat16))  # read as H rows of D (flat): no reshape
    meta = cuda_backend.sizes(n, cs)
    return tuple(kernel(
        inputs=[q, *keys, *values, meta, cuda_backend.base2_scale(scale), meta if after is None else after],
        template=[("T", keys[1].dtype), ("G", H // kv_heads), *template],
        grid=(blocks * warps * 32, kv_heads, 1), threadgroup=(warps * 32, 1, 1),
        output_shapes=[(H, splits, D), (H, splits, 2)], output_dtypes=[mx.float32, mx.float32]))
