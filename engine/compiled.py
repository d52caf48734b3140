"""A compiled decode step (`mx.compile`) over the model's own KV caches.

One token per call for plain decoding; up to `VERIFY_MAX_TOKENS` per call for
speculative verification (the last token and the drafts in one forward, traced
once per length). `engine.compute.ComputePath` owns one step of each kind per
engine, when its path compiles.

mlx-lm caches are Python objects whose ``offset`` is an int and whose
``update_and_fetch`` returns a slice that grows by one each step, so compiling
``model(token, cache)`` directly would retrace every step. Here the step is
traced with stand-in caches that hold the *whole* preallocated key/value
buffers of each `KVCache` and an ``offset`` that is an array: the new key and
value are written with a dynamic ``slice_update`` and attention covers the
buffer with a mask ``position <= offset``. Shapes then change only when the
buffers grow (every 256 tokens, as `KVCache` allocates them), so the step is
traced once per 256 tokens of context and replayed in between.

The model code is unchanged (any mlx-lm model whose layers only use
``offset``, ``update_and_fetch`` and ``make_mask`` of their cache, like llama);
caches of any other kind (quantized, windowed, recurrent) fall back to the
plain call. The ``compute.compile`` setting decides whether `engine.compute`
builds the step at all; a first compiled step that fails (MLX's CPU backend
builds fused kernels with the system C++ compiler) turns it off, logged once.
After the step the real caches hold exactly what the plain call would have
left: the same buffers with one more row and ``offset + 1``. The trace runs
the model's own arithmetic (`engine.cpu_attention.numpy_attention(False)`:
NumPy cannot run inside a trace).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from engine import cpu_attention

logger = logging.getLogger(__name__)

_GROWTH = KVCache.step


class _BufferCache:
    """Stand-in cache used while tracing: full buffers, array offset."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array) -> None:
        self.keys, self.values, self.offset = keys, values, offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.keys = mx.slice_update(self.keys, keys, self.offset, axes=(2,))
        self.values = mx.slice_update(self.values, values, self.offset, axes=(2,))
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        if window_size is not None:
            raise ValueError("the compiled step attends with full (causal) attention")
        # Query i sits at position offset + i and sees every key up to it.
        return mx.arange(self.keys.shape[2])[None] <= (self.offset + mx.arange(n))[:, None]


VERIFY_MAX_TOKENS = 16
"""Longest input the verify step compiles (the last token plus 15 drafts)."""


class CompiledDecodeStep:
    """``step(tokens, cache) -> logits`` for a few tokens, compiled; falls back when it cannot apply.

    Args:
        model: An mlx-lm model (called as ``model(tokens, cache=...)``).
        max_tokens: Longest input compiled; longer inputs take the plain call.
            Each length is traced once per buffer capacity.
        fallback: The plain call for inputs the step does not take,
            ``fallback(tokens, cache) -> logits``; ``model(tokens, cache=cache)`` when None.
    """

    def __init__(self, model: Any, max_tokens: int = 1,
                 fallback: Callable[[mx.array, Sequence[Any]], mx.array] | None = None) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self._compiled = mx.compile(self._trace)
        self._fallback = fallback or (lambda tokens, cache: model(tokens, cache=cache))
        self.enabled = True
        self.fallbacks = 0
        self.traces = 0
        self._probed = False

    def __call__(self, tokens: mx.array, cache: Sequence[Any]) -> mx.array:
        """Logits of shape (1, n, vocab) for ``tokens`` of shape (1, n); updates ``cache``."""
        if not (self.enabled and self.applies(tokens, cache, self.max_tokens)):
            self.fallbacks += 1
            return self._fallback(tokens, cache)
        n = tokens.shape[1]
        for c in cache:
            _ensure_room(c, n)
        offset = mx.array(cache[0].offset, dtype=mx.int32)
        try:
            logits, keys, values = self._compiled(tokens, offset, [c.keys for c in cache],
                                                  [c.values for c in cache])
            if not self._probed:
                mx.eval(logits, keys, values)
                self._probed = True
        except Exception as err:  # no usable compiler: decode uncompiled from now on
            logger.warning("compiled decode step unavailable, decoding uncompiled: %s", err)
            self.enabled = False
            self.fallbacks += 1
            return self._fallback(tokens, cache)
        for c, k, v in zip(cache, keys, values):
            # The old buffers are referenced by the graph only: slice_update reuses them.
            c.keys, c.values = k, v
            c.offset += n
        return logits

    @staticmethod
    def applies(tokens: mx.array, cache: Sequence[Any], max_tokens: int = 1) -> bool:
        """True for 1 .. max_tokens tokens, plain `KVCache` layers only, all at one offset."""
        return (tokens.ndim == 2 and tokens.shape[0] == 1 and 1 <= tokens.shape[1] <= max_tokens
                and len(cache) > 0
                and all(type(c) is KVCache and c.keys is not None for c in cache)
                and len({c.offset for c in cache}) == 1)

    def _trace(self, tokens: mx.array, offset: mx.array, keys: list[mx.array],
               values: list[mx.array]) -> tuple[mx.array, list[mx.array], list[mx.array]]:
        self.traces += 1
        stand_ins = [_BufferCache(k, v, offset) for k, v in zip(keys, values)]
        with cpu_attention.numpy_attention(False):  # NumPy cannot run inside a trace
            logits = self.model(tokens, cache=stand_ins)
        return logits, [c.keys for c in stand_ins], [c.values for c in stand_ins]


def _ensure_room(cache: KVCache, n: int = 1) -> None:
    """Grow the buffers (as `KVCache` would) so that `n` more rows fit."""
    capacity = cache.keys.shape[2]
    if cache.offset + n <= capacity:
        return
    extra = _GROWTH * ((n + _GROWTH - 1) // _GROWTH)

    def grown(buffer: mx.array) -> mx.array:
        pad = mx.zeros((*buffer.shape[:2], extra, buffer.shape[3]), dtype=buffer.dtype)
        return mx.concatenate([buffer[..., : cache.offset, :], pad], axis=2)

    cache.keys, cache.values = grown(cache.keys), grown(cache.values)
