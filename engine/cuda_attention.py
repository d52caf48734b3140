"""Our one-query attention over an 8-bit KV cache for MLX's CUDA backend (decode).

MLX's CUDA backend has no quantized matrix product for the 8-bit cache's layout,
so without this kernel every decode step dequantized the whole history to
bfloat16 and attended over the copy: 0.21x the speed of a float16 cache at 128k
tokens on the H200 (docs/benchmarks.md, *GPU engine*). Here the 8-bit keys and
values are read where they lie (the store's buffers, any row stride, no copy):

- split-K ("flash decoding"): each block takes one KV head and a run of
  `split` keys for all the query heads that share it (grouped-query attention
  reads each key once), keeps a running max and sum per head (online softmax),
  and writes unnormalized partial outputs; a second kernel merges the runs;
- keys: one thread per key scores it against every query head, the 8-bit values
  made exact floats with a byte permute (2^23 + q) and the group's affine scale and
  bias applied once per group (``s * q.k + b * sum(q)``); values: each lane owns
  four dimensions of the output for every head, reading rows coalesced;
- float32 throughout, exp2 with the softmax scale folded into the queries.

The engine uses it only where it measured faster than MLX's own path for the same
cache (`engine.decode_choice`); it needs `mx.fast.cuda_kernel`.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_attention_mma, cuda_attention_staged, cuda_attention_transposed, cuda_backend
from engine.cuda_backend import PRMT_HEADER, cuda_available

THREADS = 128

_SOURCE = r"""
  constexpr int NT = 128;
  constexpr int NG = D / GS;
  constexpr int WL = D / 128;      // packed words per lane in the value pass
  __shared__ float qs[G * D];
  __shared__ float qg[G * NG];
  __shared__ float ps[G * NT];
  __shared__ float red[4 * G];
  __shared__ float ostage[4 * G * D];
  const int kvh = blockIdx.y, split = blockIdx.x;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int n = meta[0], cs = meta[1], splits = gridDim.x;
  const int begin = split * cs, end = min(n, begin + cs);

  for (int i = t; i < G * D; i += NT) qs[i] = q[(size_t)kvh * G * D + i];
  __syncthreads();
  for (int i = t; i < G * NG; i += NT) {
    float s = 0.f;
    const float* src = qs + (i / NG) * D + (i % NG) * GS;
    for (int e = 0; e < GS; ++e) s += src[e];
    qg[i] = s;
  }
  __syncthreads();

  const size_t kq0 = kvh * kq_strides[1], ks0 = kvh * ks_strides[1], kb0 = kvh * kb_strides[1];
  const size_t vq0 = kvh * vq_strides[1], vs0 = kvh * vs_strides[1], vb0 = kvh * vb_strides[1];
  float m_run[G], l_run[G], acc[G][4 * WL];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m_run[h] = -INFINITY;
    l_run[h] = 0.f;
#pragma unroll
    for (int e = 0; e < 4 * WL; ++e) acc[h][e] = 0.f;
  }

  for (int tile = begin; tile < end; tile += NT) {
    const int j = tile + t;
    const bool valid = j < end;
    float sc[G];
#pragma unroll
    for (int h = 0; h < G; ++h) sc[h] = valid ? 0.f : -INFINITY;
    if (valid) {
      const uint32_t* krow = kq + kq0 + (size_t)j * kq_strides[2];
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        float part[G];
#pragma unroll
        for (int h = 0; h < G; ++h) part[h] = 0.f;
#pragma unroll
        for (int c = 0; c < GS / 16; ++c) {
          const int d0 = g * GS + c * 16;
          const uint4 kw = *reinterpret_cast<const uint4*>(krow + d0 / 4);
          float kf[16];
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            kf[b] = codectx::byte_f(kw.x, b);
            kf[4 + b] = codectx::byte_f(kw.y, b);
            kf[8 + b] = codectx::byte_f(kw.z, b);
            kf[12 + b] = codectx::byte_f(kw.w, b);
          }
#pragma unroll
          for (int h = 0; h < G; ++h)
#pragma unroll
            for (int e = 0; e < 16; ++e) part[h] = fmaf(qs[h * D + d0 + e], kf[e], part[h]);
        }
        const float s = static_cast<float>(ks[ks0 + (size_t)j * ks_strides[2] + g]);
        const float b = static_cast<float>(kb[kb0 + (size_t)j * kb_strides[2] + g]);
#pragma unroll
        for (int h = 0; h < G; ++h) sc[h] += s * part[h] + b * qg[h * NG + g];
      }
    }
    // The tile's max per head, then the running max.
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float v = sc[h];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
      if (lane == 0) red[warp * G + h] = v;
    }
    __syncthreads();
    float m_new[G];
#pragma unroll
    for (int h = 0; h < G; ++h)
      m_new[h] = fmaxf(fmaxf(m_run[h], fmaxf(red[h], red[G + h])), fmaxf(red[2 * G + h], red[3 * G + h]));
    __syncthreads();
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float p = valid ? exp2f(sc[h] - m_new[h]) : 0.f;
      ps[h * NT + t] = p;
      float v = p;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
      if (lane == 0) red[warp * G + h] = v;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float alpha = exp2f(m_run[h] - m_new[h]);
      l_run[h] = l_run[h] * alpha + (red[h] + red[G + h]) + (red[2 * G + h] + red[3 * G + h]);
      m_run[h] = m_new[h];
#pragma unroll
      for (int e = 0; e < 4 * WL; ++e) acc[h][e] *= alpha;
    }
    // Values: this warp's 32 keys of the tile, each lane 4 * WL dimensions; 8 rows' loads in flight at once.
    const int first = tile + warp * 32;
#pragma unroll
    for (int jb = 0; jb < 32; jb += 8) {
      uint32_t packed[8][WL];
      float s[8][WL], b[8][WL];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const bool live = first + jb + u < end;
        const size_t row = (size_t)(live ? first + jb + u : begin);
#pragma unroll
        for (int wl = 0; wl < WL; ++wl) {
          const int word = lane * WL + wl;
          const int g = (word * 4) / GS;
          packed[u][wl] = vq[vq0 + row * vq_strides[2] + word];
          s[u][wl] = live ? static_cast<float>(vs[vs0 + row * vs_strides[2] + g]) : 0.f;
          b[u][wl] = live ? static_cast<float>(vb[vb0 + row * vb_strides[2] + g]) : 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u)
#pragma unroll
        for (int wl = 0; wl < WL; ++wl) {
          float vf[4];
#pragma unroll
          for (int e = 0; e < 4; ++e)
            vf[e] = fmaf(s[u][wl], codectx::byte_f(packed[u][wl], e), b[u][wl]);
#pragma unroll
          for (int h = 0; h < G; ++h) {
            const float p = ps[h * NT + warp * 32 + jb + u];  // 0 for keys past the end
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[h][wl * 4 + e] = fmaf(p, vf[e], acc[h][wl * 4 + e]);
          }
        }
    }
    __syncthreads();
  }

#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int wl = 0; wl < WL; ++wl)
#pragma unroll
      for (int e = 0; e < 4; ++e) ostage[(warp * G + h) * D + (lane * WL + wl) * 4 + e] = acc[h][wl * 4 + e];
  __syncthreads();
  for (int i = t; i < G * D; i += NT) {
    const float o = (ostage[i] + ostage[G * D + i]) + (ostage[2 * G * D + i] + ostage[3 * G * D + i]);
    const int h = i / D, d = i % D;
    part_out[(((size_t)kvh * G + h) * splits + split) * D + d] = o;
  }
  if (t < G) {
    part_ml[(((size_t)kvh * G + t) * splits + split) * 2] = m_run[t];
    part_ml[(((size_t)kvh * G + t) * splits + split) * 2 + 1] = l_run[t];
  }
"""

_HEADER = PRMT_HEADER

_MERGE = r"""
  const int d = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  if (d >= D) return;
  const int splits = part_ml_shape[1];
  const float* ml = part_ml + (size_t)h * splits * 2;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, ml[2 * s]);
  float l = 0.f, o = 0.f;
  const float* po = part_out + (size_t)h * splits * D + d;
  for (int s = 0; s < splits; ++s) {
    const float w = exp2f(ml[2 * s] - m);
    l += w * ml[2 * s + 1];
    o += w * po[(size_t)s * D];
  }
  out[(size_t)h * D + d] = static_cast<T>(o / l);
"""


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any]:
    partial = cuda_backend.kernel(
        "codectx_q8_attention", _SOURCE, _HEADER,
        input_names=["q", "kq", "ks", "kb", "vq", "vs", "vb", "meta", "after"],
        output_names=["part_out", "part_ml"], ensure_row_contiguous=False)
    merge = cuda_backend.kernel("codectx_q8_merge", _MERGE, input_names=["part_out", "part_ml"], output_names=["out"])
    return partial, merge


def split_size(n: int, kv_heads: int, target_blocks: int = 2048) -> int:
    """Keys per block: a multiple of `THREADS` giving about `target_blocks` blocks, at most 4096."""
    return min(4096, cuda_backend.split_size(n, kv_heads, target_blocks, THREADS, THREADS))


def unsupported(queries: mx.array, keys: tuple, bits: int, group_size: int, kernel: str = "cores") -> str | None:
    """Why `decode_attention` cannot take this call with `kernel` (None: it can)."""
    B, H, L, D = queries.shape
    if B != 1 or L != 1:
        return f"{B} x {L} queries"
    if kernel != "cores" and keys[1].dtype not in (mx.bfloat16, mx.float16):  # read as 16-bit halves
        return f"{keys[1].dtype} scales"
    return shape_problem(H, keys[0].shape[1], D, bits, group_size, kernel)


def shape_problem(H: int, kv_heads: int, D: int, bits: int, group_size: int, kernel: str = "cores") -> str | None:
    """Why one query of `H` heads over `kv_heads` 8-bit KV heads of dim `D` is not `kernel`'s (None: it is)."""
    if not cuda_available():
        return "not MLX's CUDA backend"
    if bits != 8:
        return f"{bits}-bit cache"
    if H % kv_heads:
        return f"{H} query heads over {kv_heads} KV heads"
    if kernel in ("mma", "staged"):  # the same shapes
        return cuda_attention_mma.shape_problem(H // kv_heads, D, group_size)
    if kernel == "transposed":
        return cuda_attention_transposed.shape_problem(H // kv_heads, D, group_size)
    if D not in (128, 256) or group_size % 16 or D % group_size:
        return f"head dim {D}, group {group_size}"
    if (H // kv_heads) * D > 1024:  # shared memory and registers hold G x D floats
        return f"{H} query heads over {kv_heads} KV heads of dim {D}"
    return None


def decode_attention(queries: mx.array, keys: tuple, values: tuple, n: int | mx.array, scale: float,
                     group_size: int, kernel: str = "cores", after: mx.array | None = None) -> mx.array:
    """Softmax attention of one query per head over the first `n` 8-bit keys and values.

    A count given as an array (a traced step's, `engine.compiled`: one launch replayed until the
    buffers grow) splits the keys over the buffers' capacity instead of the count: splits past the
    count are empty and weigh nothing in the merge.

    Args:
        queries: (1, H, 1, D).
        keys, values: (packed uint32, scales, biases), each (1, H_kv, capacity >= n, ...)
            as `engine.qkv.QuantizedKVStore` holds them (not sliced: the kernel reads rows
            [0, n) through the arrays' strides).
        n: Keys to attend over: an int, or an int32 array of one element.
        scale: Multiplies the scores.
        kernel: "cores" (this module's), "mma" (`engine.cuda_attention_mma`, tensor cores), "staged"
            (`engine.cuda_attention_staged`, tensor cores, bytes staged through shared memory) or
            "transposed" (`engine.cuda_attention_transposed`, the same with keys on the products' rows);
            `shape_problem` says which takes the shape, `engine.decode_choice` measures them.
        after: An array the kernel must run after (an in-place write of the last row,
            `engine.cuda_kv_write`): passed as an input, unread.

    Returns:
        (1, H, 1, D) in the queries' dtype.
    """
    _, H, _, D = queries.shape
    kv_heads = keys[0].shape[1]
    G = H // kv_heads
    if isinstance(n, int) and n < 1:
        raise ValueError("decode attention needs at least one key")
    tensor_cores = {"mma": cuda_attention_mma, "staged": cuda_attention_staged,
                    "transposed": cuda_attention_transposed}
    if kernel in tensor_cores:  # one layout of partial outputs, one merge
        module = tensor_cores[kernel]
        part_out, part_ml = module.partial_attention(queries, keys, values, n, scale, after)
        return cuda_attention_mma.merge(part_out, part_ml, queries.dtype, (1, H, 1, D))
    partial, merge = _kernels()
    span = cuda_backend.split_span(n, keys[0].shape[2])
    cs = split_size(span, kv_heads)
    splits = -(-span // cs)
    q = (queries.reshape(H, D).astype(mx.float32) * (scale * cuda_backend.LOG2E))
    meta = cuda_backend.sizes(n, cs)
    part_out, part_ml = partial(
        inputs=[q, *keys, *values, meta, meta if after is None else after],
        template=[("T", keys[1].dtype), ("G", G), ("D", D), ("GS", group_size)],
        grid=(splits * THREADS, kv_heads, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=[(H, splits, D), (H, splits, 2)], output_dtypes=[mx.float32, mx.float32])
    threads = min(D, 128)
    out = merge(inputs=[part_out, part_ml], template=[("T", queries.dtype), ("D", D)],
                grid=(D, H, 1), threadgroup=(threads, 1, 1), output_shapes=[(H, D)], output_dtypes=[queries.dtype])[0]
    return out.reshape(1, H, 1, D)


def reference(queries: mx.array, keys: tuple, values: tuple, n: int, scale: float, group_size: int,
              mask: Any = None, bits: int = 8) -> mx.array:
    """What `decode_attention` computes, through MLX's own ops: the first `n` rows dequantized, fused attention
    (also the engine's path where the kernel does not apply)."""
    k = mx.dequantize(*(a[..., :n, :] for a in keys), group_size=group_size, bits=bits, dtype=queries.dtype)
    v = mx.dequantize(*(a[..., :n, :] for a in values), group_size=group_size, bits=bits, dtype=queries.dtype)
    return mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale, mask=mask)

