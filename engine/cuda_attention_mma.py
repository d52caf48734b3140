"""One-query attention over an 8-bit KV cache on tensor cores (MLX's CUDA backend, decode).

`engine.cuda_attention`'s kernel scores keys on the CUDA cores: 2,048 float
multiply-adds per key and KV head at Qwen3-32B's shape, about half the H200's
float32 peak at the rate the 8-bit decode goal needs (arithmetic in docs/benchmarks.md,
*GPU engine*; its decode step reached 30% of the bandwidth bound). Here both
products run as bf16 `mma.sync` (m16n8k16, float32 accumulation), and the CUDA
cores only turn bytes into bf16 and keep the softmax (on the H200 at 131,072 keys: 0.157 ms a
call against 0.359 ms on the CUDA cores, `bench/gpu_attention.py --sections decode`;
docs/benchmarks.md, *GPU engine*, fifth session):

- each warp takes a run of keys of one KV head (split-K) in tiles of 16 keys; `merge`
  folds the runs' partial outputs, eight warps per head and 32 dimensions;
- scores: A = the G query heads sharing the KV head (rows 0..15, zero past G),
  B = the tile's keys as exact bf16 integers (0..255), one accumulator per
  quantization group, then ``scale * q.x + bias * sum(q)`` per group; which of a
  group's dimensions feed which k-slot of the product is free (a dot product does
  not care), so each lane reads 16 contiguous bytes of a key row;
- values: A = probabilities times the key's value scale (bf16), B = the tile's
  value bytes (again exact bf16 integers), the value biases added once per group as
  ``sum(p * bias)``; the score accumulators' layout is the probabilities' operand
  layout, so nothing crosses lanes between the two products.

Only for D = 128, groups of 64 and G <= 16 query heads per KV head; the engine keeps
the CUDA-core kernel elsewhere. Layout assumptions (those of `engine.qkv.QuantizedKVStore`'s
buffers): key and value rows 16-byte aligned, each key's two scales (and biases) adjacent.
While one tile computes, the next one's bytes are loaded.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend
from engine.cuda_backend import PRMT_HEADER

WARPS = 4  # per block; each warp is one split of the keys
TILE = 16

HEADER = PRMT_HEADER + r"""
namespace codectx {
// Two floats as bf16x2, `lo` in the low half.
__device__ __forceinline__ uint32_t bf2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
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

SOURCE = r"""
  // D = 128, two groups of 64; lane = 4 r + c. Score fragments: head r (and r + 8), keys 2c, 2c+1, 2c+8, 2c+9
  // of the tile (j = 0..3); value fragments: the same keys, dimensions g*64 + 8r + i (i = 0..7).
  constexpr bool HI = G > 8;
  const int kvh = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
  const int split = blockIdx.x * (blockDim.x >> 5) + warp, splits = gridDim.x * (blockDim.x >> 5);
  const int n = meta[0], cs = meta[1];
  const float qscale = qscale_in[0];
  const int begin = split * cs, end = min(n, begin + cs);

  // Queries: lane (r, c) holds dims g*64 + 16c + 4t + {0..3} of heads r and r + 8 (bf16 pairs).
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
        qa[g][t][half][0] = w.x;
        qa[g][t][half][1] = w.y;
        s += (__uint_as_float(w.x << 16) + __uint_as_float(w.x & 0xFFFF0000u)) +
             (__uint_as_float(w.y << 16) + __uint_as_float(w.y & 0xFFFF0000u));
      }
      s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
      s += __shfl_xor_sync(0xFFFFFFFFu, s, 2);
      qsum[half][g] = s;
    }
  }

  const size_t kq0 = kvh * kq_strides[1], ks0 = kvh * ks_strides[1], kb0 = kvh * kb_strides[1];
  const size_t vq0 = kvh * vq_strides[1], vs0 = kvh * vs_strides[1], vb0 = kvh * vb_strides[1];
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, bacc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  float oacc[2][8][4];
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) oacc[g][i][e] = 0.f;

  // One tile's bytes: key rows tile + 8 nt + r (16 bytes per group), value rows and the scales and
  // biases of keys j (8 bytes per group; both groups' scales in one word). Rows past the warp's
  // end are read as its last row (finite) and masked below.
  struct Tile {
    uint4 kw[2][2];
    uint2 vw[4][2];
    uint32_t ksw[4], kbw[4], vsw[4], vbw[4];
  };
  const uint32_t* ks32 = reinterpret_cast<const uint32_t*>(ks);
  const uint32_t* kb32 = reinterpret_cast<const uint32_t*>(kb);
  const uint32_t* vs32 = reinterpret_cast<const uint32_t*>(vs);
  const uint32_t* vb32 = reinterpret_cast<const uint32_t*>(vb);
  auto load = [&](int tile, Tile& out) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int key = min(tile + nt * 8 + r, end - 1);
      const uint4* row = reinterpret_cast<const uint4*>(kq + kq0 + (size_t)key * kq_strides[2]);
      out.kw[nt][0] = row[c];
      out.kw[nt][1] = row[4 + c];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const size_t key = (size_t)min(tile + (j >> 1) * 8 + 2 * c + (j & 1), end - 1);
      const uint2* row = reinterpret_cast<const uint2*>(vq + vq0 + key * vq_strides[2]);
      out.vw[j][0] = row[r];
      out.vw[j][1] = row[8 + r];
      out.ksw[j] = ks32[(ks0 + key * ks_strides[2]) / 2];
      out.kbw[j] = kb32[(kb0 + key * kb_strides[2]) / 2];
      out.vsw[j] = vs32[(vs0 + key * vs_strides[2]) / 2];
      out.vbw[j] = vb32[(vb0 + key * vb_strides[2]) / 2];
    }
  };

  Tile next;
  if (begin < end) load(begin, next);
  for (int tile = begin; tile < end; tile += 16) {
    const Tile cur = next;
    if (tile + 16 < end) load(tile + 16, next);  // in flight while this tile computes
    const uint4 (&kw)[2][2] = cur.kw;
    const uint2 (&vw)[4][2] = cur.vw;
    float ksc[4][2], kbi[4][2], vsc[4][2], vbi[4][2];
    bool valid[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      valid[j] = tile + (j >> 1) * 8 + 2 * c + (j & 1) < end;
      ksc[j][0] = codectx::lo_f<T>(cur.ksw[j]);
      ksc[j][1] = codectx::hi_f<T>(cur.ksw[j]);
      kbi[j][0] = codectx::lo_f<T>(cur.kbw[j]);
      kbi[j][1] = codectx::hi_f<T>(cur.kbw[j]);
      vsc[j][0] = valid[j] ? codectx::lo_f<T>(cur.vsw[j]) : 0.f;
      vsc[j][1] = valid[j] ? codectx::hi_f<T>(cur.vsw[j]) : 0.f;
      vbi[j][0] = valid[j] ? codectx::lo_f<T>(cur.vbw[j]) : 0.f;
      vbi[j][1] = valid[j] ? codectx::hi_f<T>(cur.vbw[j]) : 0.f;
    }

    // Scores, one accumulator per group and key half-tile.
    float sacc[2][2][4];
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[g][nt][e] = 0.f;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint32_t w = t == 0 ? kw[nt][g].x : t == 1 ? kw[nt][g].y : t == 2 ? kw[nt][g].z : kw[nt][g].w;
          const uint32_t b0 = codectx::bf2(codectx::byte_f(w, 0), codectx::byte_f(w, 1));
          const uint32_t b1 = codectx::bf2(codectx::byte_f(w, 2), codectx::byte_f(w, 3));
          codectx::mma16816(sacc[g][nt], qa[g][t][0][0], qa[g][t][1][0], qa[g][t][0][1], qa[g][t][1][1], b0, b1);
        }
      }

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
#pragma unroll
      for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          oacc[g][i][half * 2] *= alpha;
          oacc[g][i][half * 2 + 1] *= alpha;
        }
    }
    if (!HI) {
#pragma unroll
      for (int j = 0; j < 4; ++j) p[1][j] = 0.f;
    }

    // Values: A = p * value scale (bf16), B = value bytes; dims g*64 + 8 * column + i.
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const uint32_t a0 = codectx::bf2(p[0][0] * vsc[0][g], p[0][1] * vsc[1][g]);
      const uint32_t a1 = codectx::bf2(p[1][0] * vsc[0][g], p[1][1] * vsc[1][g]);
      const uint32_t a2 = codectx::bf2(p[0][2] * vsc[2][g], p[0][3] * vsc[3][g]);
      const uint32_t a3 = codectx::bf2(p[1][2] * vsc[2][g], p[1][3] * vsc[3][g]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t sel = i & 3;
        const uint32_t w0 = i < 4 ? vw[0][g].x : vw[0][g].y, w1 = i < 4 ? vw[1][g].x : vw[1][g].y;
        const uint32_t w2 = i < 4 ? vw[2][g].x : vw[2][g].y, w3 = i < 4 ? vw[3][g].x : vw[3][g].y;
        const uint32_t b0 = codectx::bf2(codectx::byte_f(w0, sel), codectx::byte_f(w1, sel));
        const uint32_t b1 = codectx::bf2(codectx::byte_f(w2, sel), codectx::byte_f(w3, sel));
        codectx::mma16816(oacc[g][i], a0, a1, a2, a3, b0, b1);
      }
    }
  }

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
        dst[g * 64 + 8 * (2 * c) + i] = oacc[g][i][half * 2] + bacc[half][g];
        dst[g * 64 + 8 * (2 * c + 1) + i] = oacc[g][i][half * 2 + 1] + bacc[half][g];
      }
    if (c == 0) {
      part_ml[(h * splits + split) * 2] = m_run[half];
      part_ml[(h * splits + split) * 2 + 1] = l_run[half];
    }
  }
"""


MERGE = r"""
  // The splits' partial outputs of one head and 32 dimensions: warp w folds splits w, w + W, ...
  // (online, base 2; a split without keys has max -inf and is skipped), then warp 0 folds the warps.
  constexpr int W = 8;
  __shared__ float sm[W][32], sl[W][32], so[W][32];
  const int h = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int d = blockIdx.y * 32 + lane;
  const int splits = part_ml_shape[1];
  const float* ml = part_ml + (size_t)h * splits * 2;
  const float* po = part_out + (size_t)h * splits * D + d;
  float m = -INFINITY, l = 0.f, o = 0.f;
  for (int s = w; s < splits; s += W) {
    const float ms = ml[2 * s];
    if (ms == -INFINITY) continue;
    const float mn = fmaxf(m, ms);
    const float a = exp2f(m - mn), b = exp2f(ms - mn);
    l = l * a + ml[2 * s + 1] * b;
    o = o * a + po[(size_t)s * D] * b;
    m = mn;
  }
  sm[w][lane] = m;
  sl[w][lane] = l;
  so[w][lane] = o;
  __syncthreads();
  if (w == 0) {
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < W; ++i) M = fmaxf(M, sm[i][lane]);
    float L = 0.f, O = 0.f;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float e = exp2f(sm[i][lane] - M);
      L += sl[i][lane] * e;
      O += so[i][lane] * e;
    }
    out[(size_t)h * D + d] = static_cast<T>(O / L);
  }
"""

@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel(
        "codectx_q8_attention_mma", SOURCE, HEADER,
        input_names=["q", "kq", "ks", "kb", "vq", "vs", "vb", "meta", "qscale_in", "after"],
        output_names=["part_out", "part_ml"], ensure_row_contiguous=False)


@functools.lru_cache(maxsize=1)
def _merge_kernel() -> Any:
    return cuda_backend.kernel("codectx_q8_merge_splits", MERGE, input_names=["part_out", "part_ml"],
                               output_names=["out"])


def merge(part_out: mx.array, part_ml: mx.array, dtype: mx.Dtype, shape: tuple[int, ...] | None = None) -> mx.array:
    """The attention output from `partial_attention`'s splits, (H, D) or `shape` (the same values, as the
    caller wants them: no reshape after): a block per head and 32 dimensions, eight warps folding the
    splits side by side (the splits of one head are about 128 at long contexts: one thread walking them
    all was a chain of 128 dependent steps)."""
    H, _, D = part_out.shape
    return _merge_kernel()(inputs=[part_out, part_ml], template=[("T", dtype), ("D", D)], grid=(H * 256, D // 32, 1),
                           threadgroup=(256, 1, 1), output_shapes=[shape or (H, D)], output_dtypes=[dtype])[0]


def shape_problem(G: int, D: int, group_size: int) -> str | None:
    """Why G query heads per KV head of dim D in groups of `group_size` are not this kernel's (None: they are)."""
    if D != 128 or group_size != 64:
        return f"head dim {D}, group {group_size}"
    if G > 16:
        return f"{G} query heads per KV head"
    return None


def split_size(n: int, kv_heads: int, target_warps: int = 1024, least: int = 128) -> int:
    """Keys per warp: a multiple of the tile giving about `target_warps` warps in all (about as many
    as the H200 holds at once), at least `least` (each split's partial output is read back by the merge)."""
    return cuda_backend.split_size(n, kv_heads, target_warps, least, TILE)


def partial_attention(queries: mx.array, keys: tuple, values: tuple, n: int | mx.array, scale: float,
                      after: mx.array | None = None) -> tuple[mx.array, mx.array]:
    """Unnormalized partial outputs (H, splits, 128) and (max, sum) pairs (H, splits, 2) in base 2; `n` as
    an array splits over the buffers' capacity (`engine.cuda_attention.decode_attention`); `after`: an
    array the kernel must run after, unread."""
    B, H, L, D = queries.shape
    if B != 1 or L != 1:
        raise ValueError(f"one query of one sequence, got {B} x {L}")
    kv_heads = keys[0].shape[1]
    span = cuda_backend.split_span(n, keys[0].shape[2])
    cs = split_size(span, kv_heads)
    blocks = -(-(-(-span // cs)) // WARPS)
    splits = blocks * WARPS
    q = mx.contiguous(queries.astype(mx.bfloat16))  # read as H rows of D (flat): no reshape
    meta = cuda_backend.sizes(n, cs)
    return tuple(_kernel()(
        inputs=[q, *keys, *values, meta, cuda_backend.base2_scale(scale), meta if after is None else after],
        template=[("T", keys[1].dtype), ("G", H // kv_heads)],
        grid=(blocks * WARPS * 32, kv_heads, 1), threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[(H, splits, D), (H, splits, 2)], output_dtypes=[mx.float32, mx.float32]))
