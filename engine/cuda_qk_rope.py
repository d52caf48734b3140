"""A decode step's queries and keys normalized per head and rotated, in one launch (MLX's CUDA backend).

After the q, k and v projections a qwen3 block runs four operations on one token's heads: an RMS norm of
each query head and of each key head (``q_norm``, ``k_norm``) and RoPE on each. Llama and qwen2 blocks run
the two RoPEs. Here one launch does all of them for one token (`engine.fused_linears`, ``rope_fused``):

- one warp a head (the query heads, then the key heads), each lane two values of each half of the head;
- the norm as MLX's: ``x * rsqrt(mean(x^2) + eps)`` in float32, rounded to the activations' dtype, times the
  weight, rounded again (what the rotation reads from MLX's norm);
- RoPE as MLX's for mlx-lm's `nn.RoPE` (not traditional: value i turns with value i + D/2), the angle
  ``position * base^(-i / (D/2))`` computed as MLX's CUDA kernel computes it (``exp2`` of ``-i / (D/2) *
  log2(base)``), in float32;
- the position a runtime input (an int32 array: a traced step's, `engine.trace_caches`).

Outputs (1, heads, 1, D), as the attention and the cache write read them. `takes` says which modules it
serves: llama/qwen attention modules whose RoPE is `nn.RoPE` over the whole head, at scale 1.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine import cuda_backend

SOURCE = r"""
  // Warps 0..H-1: the query heads; H..H+KV-1: the key heads. Lane l holds values P l + p (p < P) of the head's
  // first half and the same of its second: the pairs RoPE turns together.
  constexpr int HALF = D / 2, P = HALF / 32;
  const int lane = threadIdx.x;
  const int head = blockIdx.y * blockDim.y + threadIdx.y;
  if (head >= H + KV) return;
  const bool query = head < H;
  const T* src = query ? q + (size_t)head * D : k + (size_t)(head - H) * D;
  T* dst = query ? qo + (size_t)head * D : ko + (size_t)(head - H) * D;
  float a[P], b[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    a[p] = static_cast<float>(src[P * lane + p]);
    b[p] = static_cast<float>(src[HALF + P * lane + p]);
  }
  if constexpr (NORM) {
    const T* w = query ? qw : kw;
    float squares = 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) squares += a[p] * a[p] + b[p] * b[p];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) squares += __shfl_xor_sync(0xFFFFFFFFu, squares, o);
    const float r = rsqrtf(squares / D + consts[1]);
#pragma unroll
    for (int p = 0; p < P; ++p) {  // rounded as MLX's norm rounds: T(w * T(x * r)) (w * T(...) exact in float)
      a[p] = static_cast<float>(static_cast<T>(static_cast<float>(w[P * lane + p])
                                               * static_cast<float>(static_cast<T>(a[p] * r))));
      b[p] = static_cast<float>(static_cast<T>(static_cast<float>(w[HALF + P * lane + p])
                                               * static_cast<float>(static_cast<T>(b[p] * r))));
    }
  }
  const float position = static_cast<float>(offset[0]);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float d = static_cast<float>(P * lane + p) / static_cast<float>(HALF);
    const float theta = position * exp2f(-d * consts[0]);
    const float c = cosf(theta), s = sinf(theta);
    dst[P * lane + p] = static_cast<T>(a[p] * c - b[p] * s);
    dst[HALF + P * lane + p] = static_cast<T>(a[p] * s + b[p] * c);
  }
"""
WARPS = 8


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_qk_rope", SOURCE, input_names=["q", "k", "qw", "kw", "offset", "consts"],
                               output_names=["qo", "ko"])


def takes(module: Any, dtype: mx.Dtype) -> bool:
    """Whether the kernel serves `module`'s queries and keys for activations of `dtype`: a llama/qwen attention
    module (heads, KV heads, head dim 64 or 128, a qwen3's per-head RMS norms or none) whose RoPE is mlx-lm's
    plain `nn.RoPE` over the whole head at scale 1, on MLX's CUDA backend."""
    rope = getattr(module, "rope", None)
    dim = getattr(module, "head_dim", None) or module.q_proj.weight.shape[0] // module.n_heads
    return (cuda_backend.cuda_available() and dtype in (mx.bfloat16, mx.float16) and type(rope) is nn.RoPE
            and not rope.traditional and rope.scale == 1.0 and rope.dims == dim and dim in (64, 128)
            and ("q_norm" in module) == ("k_norm" in module)  # mlx-lm's own norm (Gemma's weighs by 1 + w)
            and all(type(module[n]) is nn.RMSNorm and module[n].weight.dtype == dtype
                    for n in ("q_norm", "k_norm") if n in module))


def qk_rope(module: Any, queries: mx.array, keys: mx.array, offset: int | mx.array) -> tuple[mx.array, mx.array]:
    """`module`'s queries and keys of one token as its own step computes them after the projections (the
    per-head norms where it has them, then RoPE at `offset`): (1, H, 1, D) and (1, KV, 1, D) from the
    projections' outputs (1, 1, H * D) and (1, 1, KV * D). The caller checked `takes`."""
    heads, kv_heads = module.n_heads, module.n_kv_heads
    dim = queries.shape[-1] // heads
    norm = "q_norm" in module
    weights = (module.q_norm.weight, module.k_norm.weight) if norm else (queries, keys)  # (unread without norms)
    eps = module.q_norm.eps if norm else 0.0
    out = _kernel()(
        inputs=[queries, keys, *weights, cuda_backend.sizes(offset), _constants(module.rope.base, eps)],
        template=[("T", queries.dtype), ("D", dim), ("H", heads), ("KV", kv_heads), ("NORM", norm)],
        grid=(32, -(-(heads + kv_heads) // WARPS) * WARPS, 1), threadgroup=(32, WARPS, 1),
        output_shapes=[(1, heads, 1, dim), (1, kv_heads, 1, dim)], output_dtypes=[queries.dtype, queries.dtype])
    return out[0], out[1]


@functools.lru_cache(maxsize=16)
def _constants(base: float, eps: float) -> mx.array:
    """log2(base) and eps as the kernel reads them (made once per model, not per layer and step)."""
    return mx.array([math.log2(base), eps], dtype=mx.float32)
