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

from engine import cuda_attention_fragments as fragments
from engine import cuda_backend
from engine.cuda_attention_fragments import EPILOGUE, HEADER, QUERIES, SOFTMAX

WARPS = 4  # per block; each warp is one split of the keys
MERGE_WARPS = 16  # per block of `merge`: one head and 32 dimensions
TILE = 16

SOURCE = r"""
  // D = 128, two groups of 64; lane = 4 r + c. Score fragments: head r (and r + 8), keys 2c, 2c+1, 2c+8, 2c+9
  // of the tile (j = 0..3); value fragments: the same keys, dimensions g*64 + 8r + i (i = 0..7).
  constexpr bool F16 = false;  // the products take bf16
  constexpr float OUT_SCALE = 1.f;
""" + QUERIES + r"""  const size_t kq0 = kvh * kq_strides[1], ks0 = kvh * ks_strides[1], kb0 = kvh * kb_strides[1];
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

""" + SOFTMAX + r"""
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

""" + EPILOGUE


MERGE = r"""
  // The splits' partial outputs of one head and 32 dimensions: warp w folds splits w, w + W, ...
  // (online, base 2; a split without keys has max -inf and is skipped), U of them loaded before any is
  // folded (the loads of a step overlap), then warp 0 folds the warps.
  constexpr int W = MERGE_WARPS, U = 4;
  __shared__ float sm[W][32], sl[W][32], so[W][32];
  const int h = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int d = blockIdx.y * 32 + lane;
  const int splits = part_ml_shape[1];
  const float* ml = part_ml + (size_t)h * splits * 2;
  const float* po = part_out + (size_t)h * splits * D + d;
  float m = -INFINITY, l = 0.f, o = 0.f;
  for (int s0 = w; s0 < splits; s0 += U * W) {
    float ms[U], ls[U], os[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * W;
      const bool in = s < splits;
      ms[u] = in ? ml[2 * s] : -INFINITY;
      ls[u] = in ? ml[2 * s + 1] : 0.f;
      os[u] = in ? po[(size_t)s * D] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (ms[u] == -INFINITY) continue;
      const float mn = fmaxf(m, ms[u]);
      const float a = exp2f(m - mn), b = exp2f(ms[u] - mn);
      l = l * a + ls[u] * b;
      o = o * a + os[u] * b;
      m = mn;
    }
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
    caller wants them: no reshape after): a block per head and 32 dimensions, `MERGE_WARPS` warps folding
    the splits side by side, each loading four before folding them (the splits of one head are about 200 at
    long contexts: one thread walking them all was a chain of dependent steps; on the H200 eight warps
    folding one split at a time took 10 us a layer, 0.64 ms of a 16.7 ms step, docs/benchmarks.md)."""
    H, _, D = part_out.shape
    threads = 32 * MERGE_WARPS
    return _merge_kernel()(inputs=[part_out, part_ml], template=[("T", dtype), ("D", D), ("MERGE_WARPS", MERGE_WARPS)],
                           grid=(H * threads, D // 32, 1), threadgroup=(threads, 1, 1),
                           output_shapes=[shape or (H, D)], output_dtypes=[dtype])[0]


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
    """Unnormalized partial outputs (H, splits, 128) and (max, sum) pairs (H, splits, 2) in base 2
    (`engine.cuda_attention_fragments.partial_attention`)."""
    return fragments.partial_attention(_kernel(), queries, keys, values, n, scale, after, split_size, WARPS)
