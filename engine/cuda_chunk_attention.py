"""Attention of a short chunk (a question, a header, a verify forward) over a long bf16 cache, on
tensor cores with the keys split (MLX's CUDA backend).

For a chunk of more than one query, MLX's CUDA attention is cuDNN's, which costs a new plan for
every new query or key count (51-68 ms at 131k keys on the H200) and, for a few rows, gives
each of the 64 query heads one block that walks all the keys (45 rows over 131k keys: 0.88 ms a
layer, about 610 GB/s; docs/benchmarks.md, *GPU engine*, fifth session). Here the keys are
split across blocks, as the decode kernels split them, and nothing depends on the key count
but a runtime argument, so no shape is new:

- a block takes one run of keys of one KV head for up to 192 query rows (row = query position x
  query head of the group, 16 rows a warp, twelve warps); more rows take more blocks side by side
  in the grid's fastest dimension, so their reads of the same keys meet in the L2;
- each 32-key tile goes through shared memory once for the block's warps, keys and values as
  they lie (row = key, padded to 136 halves so no read conflicts), copied in by `cp.async`
  into two stages: the next tile is in flight while this one computes. Key fragments are
  32-bit reads; value fragments come transposed by `ldmatrix.trans`. (The first version
  transposed the values through registers into shared memory: its 16-bit stores met 16-way
  bank conflicts, and the kernel ran at 977 GB/s for 2 rows and 297 GB/s for 45: sixth session,
  run h.);
- scores and the value product are bf16 `mma.sync` m16n8k16 with float32 accumulation; the score
  accumulators are the probabilities' operand layout (nothing crosses lanes); online softmax in
  base 2; a query at position p0 + i sees keys up to p0 + i (causal within the chunk);
- the splits' partial outputs are folded by `engine.cuda_attention_mma.merge`.

bf16 keys and values of head dim 128 (the cache's buffers as the store holds them: any stride
between heads and between positions, rows 16-byte aligned), or an 8-bit store's rows (``_kernel_q8``: bytes in
groups of 64 with bf16 scales, as `engine.qkv.QuantizedKVStore` holds them): each tile's bytes and scale words
land in shared memory by `cp.async` and are widened there into the bf16 stage the same products read, so the
cache is read in half the bytes and never dequantized whole (``attention_chunk_q8``). `bench/gpu_attention.py`'s `chunk`
section measures it against MLX's attention (docs/benchmarks.md, *GPU engine*), and
`engine.decode_choice` at load (the engine runs it for forwards of 2..`decode_kernels.CHUNK_MAX_ROWS`
tokens where it wins, and for the one query of a traced bf16 decode step, ``step_traced_bf16``, with the
key count as an array: `decode_kernels.attend_chunk`).
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend, cuda_chunk_tiles
from engine.cuda_attention_fragments import HEADER
from engine.cuda_attention_mma import merge

WARPS = 12  # per block; each warp holds 16 query rows (164 registers a thread: twelve warps fill an SM's 64k)
TILE = 32  # keys per shared-memory tile
DIM = 128

CHUNK_HEADER = HEADER + r"""
namespace codectx {
// 16 bytes from global to shared memory without a register (sm_80+), kept in L2 only.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" : : "r"(s), "l"(gmem));
}
// 4 bytes from global to shared memory without a register.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" : : "r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" : :); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" : : "n"(N)); }
// Four transposed 8x8 b16 matrices from shared memory; lanes 8m..8m+7 give matrix m's row addresses.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&d)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(s));
}
}  // namespace codectx
"""

_BODY = r"""
  // lane = 4 r + c. Query rows of this block: row0 + 16 warp + r (and + 8); row = l * G + g (position l of
  // the chunk, query head g of the KV head). Score fragment e of key n-tile nt: row r + 8 (e >> 1), key
  // 8 nt + 2c + (e & 1) of the tile.
  constexpr int D = 128, TK = 32, KP = 136;
/*DECLARATIONS*/  const int kvh = blockIdx.z, split = blockIdx.y, splits = gridDim.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, r = lane >> 2, c = lane & 3;
  const int n = meta[0], L = meta[1], cs = meta[2];
  const int p0 = n - L, rows = L * G;
  const int begin = split * cs, end = min(n, begin + cs);
  const float qscale = qscale_in[0];
  const int base = blockIdx.x * (blockDim.x >> 1) + warp * 16;  // 16 rows a warp
  const bool active = base < rows;

  // Queries: A fragments of the 8 k-steps (dims 16 ks + 2c, +1 and + 8, + 9), rows r and r + 8.
  uint32_t qa[8][4];
  int limit[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = base + r + 8 * hf;
    const bool live = row < rows;
    const int l = live ? row / G : 0, g = live ? row % G : 0;
    limit[hf] = live ? p0 + l : -1;  // the last key this row sees (none for a padding row)
    const uint32_t* qr = reinterpret_cast<const uint32_t*>(q) + ((size_t)(kvh * G + g) * L + l) * (D / 2);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      qa[s][hf] = live ? qr[8 * s + c] : 0u;
      qa[s][2 + hf] = live ? qr[8 * s + 4 + c] : 0u;
    }
  }

/*FETCH*/
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float oacc[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) oacc[i][e] = 0.f;

  if (begin < end) fetch(0, begin);
  codectx::cp_async_commit();
  int st = 0;
  for (int tile = begin; tile < end; tile += TK, st ^= 1) {
    if (tile + TK < end) fetch(st ^ 1, tile + TK);  // in flight while this tile computes
    codectx::cp_async_commit();
    codectx::cp_async_wait<1>();  // this tile has landed
    __syncthreads();
/*CONVERT*/    if (active) {
      float sacc[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[nt][e] = 0.f;
        const uint32_t* krow = reinterpret_cast<const uint32_t*>(&ks[BF][nt * 8 + r][0]);
#pragma unroll
        for (int s = 0; s < 8; ++s)
          codectx::mma16816(sacc[nt], qa[s][0], qa[s][1], qa[s][2], qa[s][3], krow[8 * s + c], krow[8 * s + 4 + c]);
      }

      // Online softmax per row half; a row that sees no key of this tile keeps its state.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mt = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int key = tile + nt * 8 + 2 * c + j;
            const float s = (key < end && key <= limit[hf]) ? sacc[nt][2 * hf + j] * qscale : -INFINITY;
            sacc[nt][2 * hf + j] = s;
            mt = fmaxf(mt, s);
          }
        mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xFFFFFFFFu, mt, 2));
        const float m_new = fmaxf(m_run[hf], mt);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m_run[hf] - m_use);
        m_run[hf] = m_new;
        float psum = 0.f;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float e = exp2f(sacc[nt][2 * hf + j] - m_use);
            sacc[nt][2 * hf + j] = e;
            psum += e;
          }
        l_run[hf] = fmaf(l_run[hf], alpha, psum);
        if (__any_sync(0xFFFFFFFFu, alpha != 1.f)) {  // skipped when no row's maximum moved in this tile
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            oacc[i][2 * hf] *= alpha;
            oacc[i][2 * hf + 1] *= alpha;
          }
        }
      }

      // Values: A = the probabilities of keys 16 kk .. 16 kk + 15; B from the stage by transposed
      // ldmatrix: matrix m of lane 8m + j is keys 16 kk + j + 8 (m & 1), dims 16 d + 8 (m >> 1), so d[0], d[1]
      // are dims 16 d .. + 7 and d[2], d[3] dims 16 d + 8 .. + 15.
      const int vkey = (lane & 7) + 8 * ((lane >> 3) & 1), vdim = 8 * (lane >> 4);
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const uint32_t a0 = codectx::bf2(sacc[2 * kk][0], sacc[2 * kk][1]);
        const uint32_t a1 = codectx::bf2(sacc[2 * kk][2], sacc[2 * kk][3]);
        const uint32_t a2 = codectx::bf2(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
        const uint32_t a3 = codectx::bf2(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
#pragma unroll
        for (int d = 0; d < 8; ++d) {
          uint32_t b[4];
          codectx::ldsm_x4_t(b, &vs[BF][16 * kk + vkey][16 * d + vdim]);
          codectx::mma16816(oacc[2 * d], a0, a1, a2, a3, b[0], b[1]);
          codectx::mma16816(oacc[2 * d + 1], a0, a1, a2, a3, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next fetch refills it
  }
  if (!active) return;

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l_run[hf] += __shfl_xor_sync(0xFFFFFFFFu, l_run[hf], 1);
    l_run[hf] += __shfl_xor_sync(0xFFFFFFFFu, l_run[hf], 2);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = base + r + 8 * hf;
    if (row >= rows) continue;
    const size_t out_row = (size_t)(kvh * G + row % G) * L + row / G;
    float* dst = part_out + (out_row * splits + split) * D;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      dst[8 * i + 2 * c] = oacc[i][2 * hf];
      dst[8 * i + 2 * c + 1] = oacc[i][2 * hf + 1];
    }
    if (c == 0) {
      part_ml[(out_row * splits + split) * 2] = m_run[hf];
      part_ml[(out_row * splits + split) * 2 + 1] = l_run[hf];
    }
  }
"""


"""The kernel with its tile's source left open (`engine.cuda_chunk_tiles`: a bf16 cache's tiles or an 8-bit
store's)."""

def _source(parts: dict[str, str]) -> str:
    body = _BODY
    for slot, text in parts.items():
        body = body.replace(slot, text)
    return body


SOURCE = _source(cuda_chunk_tiles.BF16)
SOURCE_Q8 = _source(cuda_chunk_tiles.Q8)


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_chunk_attention", SOURCE, CHUNK_HEADER,
                               input_names=["q", "k", "v", "meta", "qscale_in"], output_names=["part_out", "part_ml"],
                               ensure_row_contiguous=False)


@functools.lru_cache(maxsize=1)
def _kernel_q8() -> Any:
    return cuda_backend.kernel("codectx_chunk_attention_q8", SOURCE_Q8, CHUNK_HEADER,
                               input_names=["q", "kq", "kscale", "kbias", "vq", "vscale", "vbias", "meta", "qscale_in"],
                               output_names=["part_out", "part_ml"], ensure_row_contiguous=False)


def shape_problem(L: int, G: int, D: int, dtype: mx.Dtype) -> str | None:
    """Why a chunk of L queries with G query heads per KV head of dim D and this cache dtype is not
    this kernel's (None: it is)."""
    if D != DIM or dtype != mx.bfloat16:
        return f"head dim {D}, {dtype} cache"
    if L < 1:
        return "no queries"
    return None


def split_size(n: int, blocks_per_split: int, target_blocks: int = 528, least: int = 256) -> int:
    """Keys per split: a multiple of the tile giving about `target_blocks` blocks in all (four per SM of
    the H200's 132), at least `least` (each split's partial outputs are read back by the merge)."""
    return cuda_backend.split_size(n, blocks_per_split, target_blocks, least, TILE)


def q8_rows_problem(D: int, bits: int, group_size: int, dtype: mx.Dtype) -> str | None:
    """Why an 8-bit store's rows of dim D (`bits`, groups of `group_size`, scales in `dtype`) are not the 8-bit
    kernel's (None: they are): bytes of dim 128 in groups of 64, bf16 scales."""
    if D != DIM or bits != 8 or group_size != 64 or dtype != mx.bfloat16:
        return f"head dim {D}, {bits}-bit cache in groups of {group_size}, {dtype} scales"
    return None


def q8_problem(L: int, G: int, D: int, keys: tuple, values: tuple) -> str | None:
    """Why a chunk of L queries with G query heads per KV head of dim D over an 8-bit store's (packed, scales,
    biases) keys and values is not the 8-bit kernel's (None: it is; `q8_rows_problem`)."""
    for packed, scales, _ in (keys, values):
        bits = packed.shape[-1] * 32 // D if packed.dtype == mx.uint32 else 0
        problem = q8_rows_problem(D, bits, D // max(1, scales.shape[-1]), scales.dtype)
        if problem is not None:
            return problem
    return shape_problem(L, G, D, mx.bfloat16)


def chunk_attention(queries: mx.array, keys: mx.array | tuple, values: mx.array | tuple, n: int | mx.array,
                    scale: float) -> mx.array:
    """Causal attention of `queries` (1, H, L, 128), the chunk's last positions, over the first `n`
    rows of `keys`/`values` (1, KV heads, >= n, 128; bf16; the chunk's own keys are rows n - L .. n - 1), or
    of an 8-bit store's (packed, scales, biases) triples of those rows (`q8_problem`: the 8-bit kernel, whose
    tiles are widened to bf16 in shared memory).
    `n` may be an int32 array of one element (a traced decode step's key count, `engine.trace_caches`):
    the keys are then split over the buffers' rows, not the count (splits past it are empty).

    Returns:
        (1, H, L, 128) in the queries' dtype.
    """
    B, H, L, D = queries.shape
    eight_bit = isinstance(keys, tuple)
    key_rows, value_rows = (keys[0], values[0]) if eight_bit else (keys, values)
    kv_heads = key_rows.shape[1]
    G = H // kv_heads
    problem = f"{B} sequences" if B != 1 else q8_problem(L, G, D, keys, values) if eight_bit else \
        shape_problem(L, G, D, keys.dtype)
    span = cuda_backend.split_span(n, min(key_rows.shape[2], value_rows.shape[2]))
    if problem is not None or span < L or key_rows.shape[2] < span or value_rows.shape[2] < span:
        raise ValueError(f"not a chunk this kernel takes: {problem or f'{L} queries, {n} of {key_rows.shape[2]} keys'}")
    row_blocks = -(-(L * G) // (16 * WARPS))
    cs = split_size(span, row_blocks * kv_heads)
    splits = -(-span // cs)
    q = mx.contiguous(queries.astype(mx.bfloat16))  # read as H x L rows of D (flat): no reshape
    meta = cuda_backend.sizes(n, L, cs)
    kernel, kv = (_kernel_q8(), [*keys, *values]) if eight_bit else (_kernel(), [keys, values])
    part_out, part_ml = kernel(
        inputs=[q, *kv, meta, cuda_backend.base2_scale(scale)], template=[("G", G)],
        grid=(row_blocks * WARPS * 32, splits, kv_heads), threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[(H * L, splits, D), (H * L, splits, 2)], output_dtypes=[mx.float32, mx.float32])
    return merge(part_out, part_ml, queries.dtype, (1, H, L, D))


def reference(queries: mx.array, keys: mx.array | tuple, values: mx.array | tuple, n: int, scale: float) -> mx.array:
    """The same attention through MLX (float32; 8-bit triples dequantized first): what the kernel is checked
    against."""
    L = queries.shape[2]
    if isinstance(keys, tuple):
        keys, values = (mx.dequantize(*(a[..., :n, :] for a in t), group_size=64, bits=8) for t in (keys, values))
    k, v = keys[:, :, :n, :].astype(mx.float32), values[:, :, :n, :].astype(mx.float32)
    return mx.fast.scaled_dot_product_attention(queries.astype(mx.float32), k, v, scale=scale,
                                                mask="causal" if L > 1 else None)
