"""A compiled decode step (`mx.compile`) over the model's own KV caches.

One token per call for plain decoding; up to `VERIFY_MAX_TOKENS` per call for
speculative verification (the last token and the drafts in one forward, traced
once per length). `engine.compute.ComputePath` owns one step of each kind per
engine, when its path compiles.

mlx-lm caches are Python objects whose ``offset`` is an int and whose
``update_and_fetch`` returns a slice that grows by one each step, so compiling
``model(token, cache)`` directly would retrace every step. Here the step is
traced with stand-in caches (`engine.trace_caches`) that hold the *whole*
preallocated buffers of each layer and an ``offset`` that is an array: the new
keys and values are written at that position inside the trace and attention
covers the buffer with a mask ``position <= offset`` (or, on our CUDA kernels,
takes the key count as an array). Shapes then change only when the buffers grow
(a write past them grows them by 256 positions; where our kernels' traces run, the
engine's window caches keep room ahead, `engine.qkv.Room`, and grow about once per
2,048 positions; where MLX's attention runs in the trace, which attends over the
whole buffers, they keep none),
so the step is traced once per buffer size and replayed in between.

The model code is unchanged (any mlx-lm model whose layers only use ``offset``,
``update_and_fetch`` and ``make_mask`` of their cache, like llama). It applies to
mlx-lm's `KVCache` and to the engine's window caches (`engine.window`: full
precision or 8-bit) at positions the window policy attends densely (decode);
anything else (a windowed position, a sliding or recurrent layer) takes the
plain call. The ``compute.compile`` setting decides whether `engine.compute`
builds the step at all; with our CUDA decode kernels the path builds it only where
`engine.decode_choice` measured it faster (one token: ``step_traced`` over 8-bit
caches, ``step_traced_bf16`` over bf16 ones). A first compiled step that fails (MLX's CPU backend builds fused kernels
with the system C++ compiler) turns it off, logged once. After the step the real
caches hold exactly what the plain call would have left: the same buffers with
the rows written and ``offset + n``. The trace runs the model's own arithmetic
(`engine.cpu_attention.numpy_attention(False)`: NumPy cannot run inside a trace).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Sequence

import mlx.core as mx

from engine import cpu_attention, trace_caches

logger = logging.getLogger(__name__)

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
        scope: The context the model runs in while traced, given the token count (the compute path's
            switches: they hold while the trace is made, and the trace replays what ran).
        ours: The window caches' stores whose one-token step the trace takes with our CUDA kernels in it
            (`engine.trace_caches`: "q8", "dense"); empty: MLX's kernels, any cache it takes.
        windows: Take the engine's window caches, not only mlx-lm's `KVCache` (off where the path's
            attention is NumPy's, which a trace cannot hold: NumPy's beats MLX's attention over long
            contexts, docs/benchmarks.md, *Engine (CPU)* → 6; not measured against the traced step).
    """

    def __init__(self, model: Any, max_tokens: int = 1,
                 fallback: Callable[[mx.array, Sequence[Any]], mx.array] | None = None,
                 scope: Callable[[int], contextlib.AbstractContextManager[None]] | None = None,
                 ours: frozenset[str] = frozenset(), windows: bool = True) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.ours, self.windows = ours, windows
        self._compiled = mx.compile(self._trace)
        self._fallback = fallback or (lambda tokens, cache: model(tokens, cache=cache))
        self._scope = scope or (lambda n: contextlib.nullcontext())
        self.enabled = True
        self.fallbacks = 0
        self.traces = 0
        self._probed = False

    def __call__(self, tokens: mx.array, cache: Sequence[Any]) -> mx.array:
        """Logits of shape (1, n, vocab) for ``tokens`` of shape (1, n); updates ``cache``."""
        buffers = self._buffers(tokens, cache)
        if buffers is None:
            self.fallbacks += 1
            return self._fallback(tokens, cache)
        n = tokens.shape[1]
        offset = mx.array(cache[0].offset, dtype=mx.int32)
        try:
            logits, written = self._compiled(tokens, offset, buffers)
            if not self._probed:
                mx.eval(logits, written)
                self._probed = True
        except Exception as err:  # no usable compiler: decode uncompiled from now on
            logger.warning("compiled decode step unavailable, decoding uncompiled: %s", err)
            self.enabled = False
            self.fallbacks += 1
            return self._fallback(tokens, cache)
        for c, b in zip(cache, written):
            # The old buffers are referenced by the graph only: slice_update reuses them.
            trace_caches.put_back(c, b, n)
        return logits

    def _buffers(self, tokens: mx.array, cache: Sequence[Any]) -> list[trace_caches.Buffers] | None:
        """Each layer's buffers with room for the tokens (`engine.trace_caches.layer_buffers`), all layers at
        one offset; None: the plain call (whose write finds the room made)."""
        n = tokens.shape[1] if tokens.ndim == 2 else 0
        if not (self.enabled and tokens.shape[0] == 1 and 1 <= n <= self.max_tokens and len(cache) > 0
                and len({getattr(c, "offset", None) for c in cache}) == 1):
            return None
        buffers = []
        for c in cache:
            layer = trace_caches.layer_buffers(c, n, self.ours, self.windows)
            if layer is None:
                return None
            buffers.append(layer)
        return buffers

    def _trace(self, tokens: mx.array, offset: mx.array,
               buffers: list[trace_caches.Buffers]) -> tuple[mx.array, list[tuple[Any, Any]]]:
        self.traces += 1
        stand_ins = [trace_caches.stand_in(b, offset, self.ours) for b in buffers]
        with cpu_attention.numpy_attention(False), self._scope(tokens.shape[1]):  # NumPy cannot run in a trace
            logits = self.model(tokens, cache=stand_ins)
        return logits, [c.buffers() for c in stand_ins]
