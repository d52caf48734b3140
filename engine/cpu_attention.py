"""Attention on MLX's CPU backend with NumPy's vectorized `exp`, wired per model.

On this CPU, MLX's `exp` was 19–45x slower than NumPy's SIMD `exp` over one
layer's attention scores, so attention over a long context cost more than the
model's matmuls: one 512-token chunk over 4,200 keys took 26.8 s with MLX's
SDPA and 7.6 s here (`bench/cpu_attention.py`; numbers in docs/benchmarks.md,
*Engine (CPU)* → 6).

`wire(model)` gives each attention module of a llama/qwen-style model a
subclass of its own class (`SUPPORTED`) whose call runs the same steps with
`attention` below: scores, softmax and the value product in NumPy (float32),
per KV head with the query heads of a group stacked (grouped-query attention
without copying keys). Nothing module-wide changes: mlx-lm's functions stay
as they are, other models are untouched, and even a wired module computes
with MLX unless its caller asked for NumPy on this thread (`numpy_attention`,
which `engine.compute.ComputePath` enters around its model calls). So an
`mx.compile` trace, or any caller that did not ask, runs the model's own
arithmetic. On MLX's CUDA backend the same wired call serves our short-chunk
attention kernel (`engine.decode_kernels.chunk_on`, `attend_chunk`) and a decode
step's fused q, k and v projections and rotation (`engine.decode_kernels.fused_on`,
`rope_on`, `engine.fused_linears`).

NumPy's own OpenBLAS is limited to one thread while MLX runs the layers: two
OpenBLAS thread pools on two cores were slower (same section).
`engine.cpu_forward` runs the whole layer in NumPy on top of `attend` and
gives NumPy's pool the cores.

It is exact up to float32 rounding for float32/float16/bfloat16 arrays;
8-bit caches (`cache.bits`) are dequantized first. Other dtypes, and calls
without a cache, go to the module's own call.
"""
from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import base

from engine import blas, decode_kernels, fused_linears
from engine.switches import Switch

logger = logging.getLogger(__name__)

SUPPORTED = frozenset({("mlx_lm.models.llama", "Attention"), ("mlx_lm.models.qwen2", "Attention"),
                       ("mlx_lm.models.qwen3", "Attention")})
"""Attention classes whose call is: q/k/v projections, (qwen3) per-head q/k norms, RoPE at the
cache offset, `cache.update_and_fetch`, scaled dot-product attention, output projection."""

_FLOAT_TYPES = (mx.float32, mx.float16, mx.bfloat16)
_numpy = Switch("codectx_numpy_attention")
_wired_classes: dict[type, type] = {}
numpy_attention = _numpy.scope
"""Inside this block, wired attention modules on this thread use NumPy (or, False: MLX)."""


def wire(model: Any) -> int:
    """Give every supported attention module of `model` (this instance only) the NumPy-capable call.

    Idempotent. The modules keep their parameters and compute exactly as
    before unless called inside `numpy_attention()`.

    Returns:
        How many attention modules are wired (0: the model's attention does not match `SUPPORTED`).
    """
    wired = 0
    for module in _attention_modules(model):
        cls = type(module)
        if cls not in _wired_classes.values():
            module.__class__ = _wired_class(cls)
        wired += 1
    return wired


def wirable(model: Any) -> bool:
    """Whether `wire` would wire any of `model`'s attention modules (nothing is changed)."""
    return bool(_attention_modules(model))


def _attention_modules(model: Any) -> list[nn.Module]:
    modules = model.modules() if isinstance(model, nn.Module) else []
    return [m for m in modules if (type(m).__module__, type(m).__name__) in SUPPORTED
            or type(m) in _wired_classes.values()]


def _wired_class(cls: type) -> type:
    """The subclass of an mlx-lm attention class whose call can attend through NumPy (made once)."""
    if cls not in _wired_classes:
        original = cls.__call__

        def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
            if cache is None or x.dtype not in _FLOAT_TYPES:
                return original(self, x, mask=mask, cache=cache)
            if _numpy.on():
                return _numpy_step(self, x, mask, cache)
            if decode_kernels.chunk_on():
                return _chunk_step(self, x, mask, cache)
            if decode_kernels.fused_on() or decode_kernels.rope_on():
                return _fused_step(self, x, mask, cache)
            return original(self, x, mask=mask, cache=cache)

        _wired_classes[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": __name__,
                                                          "__qualname__": f"wired {cls.__module__}.{cls.__name__}"})
    return _wired_classes[cls]


def _queries_and_cache(module: Any, x: mx.array, cache: Any) -> tuple[mx.array, Any, Any]:
    """The llama/qwen attention step of `module` up to attention: its queries, and the keys and
    values the cache returns once it holds this chunk's."""
    B, L, _ = x.shape
    queries, keys, values = fused_linears.projections(module, x)  # (the layers' own calls, unless fused)
    values = values.reshape(B, L, module.n_kv_heads, -1).transpose(0, 2, 1, 3)
    queries, keys = fused_linears.rotated(module, queries, keys, cache.offset)
    return (queries, *cache.update_and_fetch(keys, values))


def _output(module: Any, output: mx.array) -> mx.array:
    B, _, L, _ = output.shape
    return module.o_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1))


def _numpy_step(module: Any, x: mx.array, mask: Any, cache: Any) -> mx.array:
    """The llama/qwen attention step of `module` with `attention` in place of MLX's SDPA."""
    queries, keys, values = _queries_and_cache(module, x, cache)
    keys, values = dequantized(keys, values, cache)
    use_numpy_threads(1)  # MLX runs the layers around this call
    return _output(module, attention(queries, keys, values, module.scale, mask))


def _chunk_step(module: Any, x: mx.array, mask: Any, cache: Any) -> mx.array:
    """The same step with `engine.decode_kernels.attend_chunk` (our CUDA kernel for a short chunk)."""
    queries, keys, values = _queries_and_cache(module, x, cache)
    return _output(module, decode_kernels.attend_chunk(queries, keys, values, cache, module.scale, mask))


def _fused_step(module: Any, x: mx.array, mask: Any, cache: Any) -> mx.array:
    """The model's own step (mlx-lm's attention), its q, k and v projections and one token's norms and RoPE
    each in one launch where they are switched on (`engine.fused_linears`)."""
    queries, keys, values = _queries_and_cache(module, x, cache)
    return _output(module, base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=module.scale,
                                                             mask=mask))


def dequantized(keys, values, cache: Any) -> tuple[mx.array, mx.array]:
    """Keys and values as `cache.update_and_fetch` returned them, 8-bit triples dequantized."""
    if not hasattr(cache, "bits"):
        return keys, values
    return (mx.dequantize(*keys, group_size=cache.group_size, bits=cache.bits),
            mx.dequantize(*values, group_size=cache.group_size, bits=cache.bits))


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
              mask: str | mx.array | None) -> mx.array:
    """Softmax attention, as `mx.fast.scaled_dot_product_attention` computes it.

    Args:
        queries: (B, H, n, D).
        keys, values: (B, H_kv, L, D) with H a multiple of H_kv.
        scale: Multiplies the scores.
        mask: None, "causal" (bottom-right aligned: query i sees keys up to
            L - n + i), a boolean array (True = attend) or an additive array,
            broadcastable to (B, H, n, L).

    Returns:
        (B, H, n, D) in the queries' dtype.
    """
    dtype = queries.dtype
    mx.eval(queries, keys, values)
    out = attend(as_numpy(queries), as_numpy(keys), as_numpy(values), scale, mask)
    result = mx.array(out)
    return result if dtype == mx.float32 else result.astype(dtype)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
           mask: str | mx.array | np.ndarray | None) -> np.ndarray:
    """`attention` on float32 NumPy arrays, shapes as there (a mask may also be a NumPy array);
    returns (B, H, n, D) float32."""
    B, H, n, D = q.shape
    H_kv, L = k.shape[1], k.shape[2]
    group = H // H_kv
    q = q.reshape(B, H_kv, group, n, D) * np.float32(scale)
    # A causal mask only touches the last n keys: add its triangle there, not a bias over all L.
    causal = isinstance(mask, str) and mask == "causal" and n > 1
    triangle = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1) if causal else None
    bias = None if causal else _bias(mask, B, H_kv, group, n, L)
    out = np.empty((B, H_kv, group, n, v.shape[-1]), dtype=np.float32)
    for b in range(B):
        for h in range(H_kv):
            scores = q[b, h].reshape(group * n, D) @ k[b, h].T
            if triangle is not None:
                scores.reshape(group, n, L)[:, :, L - n:] += triangle
            elif bias is not None:
                scores = scores.reshape(group, n, L)
                scores += bias[b % bias.shape[0], h % bias.shape[1]]
                scores = scores.reshape(group * n, L)
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            head = out[b, h].reshape(group * n, -1)
            np.matmul(scores, v[b, h], out=head)
            head /= scores.sum(axis=-1, keepdims=True)
    return out.reshape(B, H, n, -1)


def as_numpy(x: mx.array) -> np.ndarray:
    """`x` evaluated, as a float32 NumPy array (a view when it already is float32)."""
    if x.dtype != mx.float32:
        x = x.astype(mx.float32)
    mx.eval(x)
    return np.asarray(x)


def _bias(mask: str | mx.array | np.ndarray | None, B: int, H_kv: int, group: int, n: int, L: int) -> np.ndarray | None:
    """An additive (b, h, group-or-1, n, L) float32 bias, or None for no mask."""
    if mask is None or (isinstance(mask, str) and n == 1):
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        allowed = np.arange(L)[None, :] <= (np.arange(n) + (L - n))[:, None]
        return np.where(allowed, np.float32(0), np.float32(-np.inf))[None, None, None]
    if isinstance(mask, np.ndarray):  # engine.batch_forward's tree masks arrive as NumPy already
        m = mask if mask.dtype == np.bool_ else mask.astype(np.float32, copy=False)
    else:
        m = np.asarray(mask.astype(mx.bool_) if mask.dtype == mx.bool_ else mask.astype(mx.float32))
    m = np.broadcast_to(m, (1,) * (4 - m.ndim) + m.shape) if m.ndim < 4 else m
    if m.dtype == np.bool_:
        m = np.where(m, np.float32(0), np.float32(-np.inf))
    # (b, heads, n, L) -> (b, kv heads, group, n, L): query head h*group + g belongs to KV head h.
    if m.shape[1] == 1:
        return m[:, :, None]
    return m.reshape(m.shape[0], H_kv, group, m.shape[2], m.shape[3])


def use_numpy_threads(threads: int) -> None:
    """Give NumPy's OpenBLAS `threads` threads unless it already has them (cheap per call).

    The count is process-wide (NumPy's library has one pool), and which one is
    right depends on who runs the layers: 1 while MLX does (its own BLAS pool
    would fight NumPy's), all cores while `engine.cpu_forward` does. Each path
    sets it before it computes.
    """
    global _numpy_threads
    if _numpy_threads != threads:
        numpy_blas_threads(threads)
        _numpy_threads = threads


_numpy_threads: int | None = None


def numpy_blas_threads(threads: int = 1) -> None:
    """Set the thread count of NumPy's bundled OpenBLAS (MLX's BLAS keeps its own pool)."""
    libs_dir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    try:
        names = [f for f in os.listdir(libs_dir) if "openblas" in f]
    except OSError:
        return
    for name in names:
        try:
            lib = ctypes.CDLL(os.path.join(libs_dir, name))
        except OSError:
            continue
        if blas.set_threads(lib, threads):
            logger.debug("NumPy OpenBLAS (%s): %d thread(s)", name, threads)
