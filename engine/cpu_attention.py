"""Attention on MLX's CPU backend with NumPy's vectorized `exp`.

On this CPU, MLX's `exp` was 19–45x slower than NumPy's SIMD `exp` over one
layer's attention scores, so attention over a long context cost more than the
model's matmuls: one 512-token chunk over 4,200 keys took 26.8 s with MLX's
SDPA and 7.6 s here (`bench/cpu_attention.py`; numbers in docs/benchmarks.md,
*Engine (CPU)* → 6).
`install(model)` routes the model's attention through `attention` below:
scores, softmax and the value product in NumPy (float32), per KV head with
the query heads of a group stacked (grouped-query attention without copying
keys). NumPy's own OpenBLAS is limited to one thread while MLX runs the
layers: two OpenBLAS thread pools on two cores were slower (same section).
`engine.cpu_forward` runs the whole layer in NumPy on top of `attend` and
gives NumPy's pool the cores.

It applies only where it helps and is exact up to float32 rounding: the
default device is the CPU, the arrays are float32/float16/bfloat16, there
are no attention sinks, and no `mx.compile` trace is running (`suspended()`).
8-bit caches (`cache.bits`) are dequantized first. Anything else goes to the
model file's own function. ``CODECTX_CPU_ATTENTION=off`` turns it off.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
from typing import Any, Callable, Iterator

import mlx.core as mx
import numpy as np

from engine import blas

logger = logging.getLogger(__name__)

ENV_SWITCH = "CODECTX_CPU_ATTENTION"
_FLOAT_TYPES = (mx.float32, mx.float16, mx.bfloat16)
_local = threading.local()
_originals: dict[str, Callable[..., mx.array]] = {}


def enabled() -> bool:
    """True when the NumPy path may run in this process (CPU device, not switched off)."""
    return os.environ.get(ENV_SWITCH, "on").lower() not in ("off", "0", "false") and \
        mx.default_device() == mx.cpu


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Use the model's own attention inside this block (e.g. while `mx.compile` traces)."""
    depth = getattr(_local, "suspended", 0)
    _local.suspended = depth + 1
    try:
        yield
    finally:
        _local.suspended = depth


def install(model: Any) -> bool:
    """Routes the attention of `model`'s architecture through `attention` (idempotent).

    mlx-lm model files import `scaled_dot_product_attention` from
    `mlx_lm.models.base` by name; this replaces that name in the model's
    module. Other models of the same architecture in the process share it,
    which is harmless: the replacement falls back to the original wherever
    it does not apply.

    Returns:
        True when the model's attention now goes through `attention`.
    """
    if not enabled():
        return False
    module = sys.modules.get(type(model).__module__)
    if module is None or not hasattr(module, "scaled_dot_product_attention"):
        return False
    if module.__name__ not in _originals:
        original = module.scaled_dot_product_attention
        _originals[module.__name__] = original
        module.scaled_dot_product_attention = _dispatcher(original)
        logger.info("CPU attention through NumPy for %s", module.__name__)
    return True


def _dispatcher(original: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
        if sinks is not None or getattr(_local, "suspended", 0) or queries.dtype not in _FLOAT_TYPES:
            return original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
        keys, values = dequantized(keys, values, cache)
        use_numpy_threads(1)  # MLX runs the layers around this call
        return attention(queries, keys, values, scale, mask)

    scaled_dot_product_attention.original = original
    return scaled_dot_product_attention


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
           mask: str | mx.array | None) -> np.ndarray:
    """`attention` on float32 NumPy arrays, shapes as there; returns (B, H, n, D) float32."""
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


def _bias(mask: str | mx.array | None, B: int, H_kv: int, group: int, n: int, L: int) -> np.ndarray | None:
    """An additive (b, h, group-or-1, n, L) float32 bias, or None for no mask."""
    if mask is None or (isinstance(mask, str) and n == 1):
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown attention mask {mask!r}")
        allowed = np.arange(L)[None, :] <= (np.arange(n) + (L - n))[:, None]
        return np.where(allowed, np.float32(0), np.float32(-np.inf))[None, None, None]
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

    The count is process-wide, and which one is right depends on who runs the
    layers: 1 while MLX does (its own BLAS pool would fight NumPy's), all cores
    while `engine.cpu_forward` does. Each path sets it before it computes.
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
