"""Windowed prefill as a KV-cache policy.

Attention layers in mlx-lm call `cache.update_and_fetch(keys, values)` after
RoPE and take their mask from `cache.make_mask(N)`. `WindowKVCache` uses that
to choose which keys a prefill chunk attends to, so model files stay
unchanged. Block form (the default): a chunk [s, s+n) whose positions are all
windowed sees the global region [0, G), the W keys before the chunk
[s-W, s), and itself causally. Those keys are returned contiguously with the
string mask "causal", which the fused attention kernel aligns bottom-right.
The per-query form (for measurement) gives each query q exactly
[0, G) + [q-W, q] through an explicit boolean mask.

Which positions are windowed is a function of the prompt layout only: a
position q is windowed when q < dense_from and the window leaves a gap
(q - W > G). `WindowPolicy.dense_from` derives dense_from from the segment
layout; the runtime sets it on the caches with `set_dense_from` before each
prefill. Decode and everything from dense_from on is dense.

Checkpoints: the state over positions [0, b) depends on the layout only
through `WindowPolicy.layout_key(b, dense_from)`; mix it into checkpoint
identity together with the policy fingerprint.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache

from engine import cuda_chunk_attention, decode_kernels
from engine.qkv import DenseKVStore, KVStore, QuantizedKVStore, direct_attention_works
from engine.request import SegmentKind, SegmentLike, segment_kind

DENSE_KINDS = tuple(sorted(k.value for k in SegmentKind if k.dense))
"""Segment kinds always prefilled densely (`SegmentKind.dense`), for the policy fingerprint."""

DIRECT_QUERY_LIMIT = 32
"""At most this many queries attend to the 8-bit history directly (decode,
speculative verification); larger chunks use dequantized slices + the fused kernel."""

FORMS = ("block", "query")


@dataclass(frozen=True)
class WindowPolicy:
    """Which keys prefill attends to.

    Args:
        enabled: False gives exact (dense) attention everywhere.
        global_tokens: G, the leading positions every query sees.
        window_tokens: W, the recent keys a query (block form: its chunk) sees.
        dense_tail: Dense positions before the end of the stable segments
            (system, tools, map, files) of a segment layout.
        continuation_tail: Dense positions at the end of a plain token prompt
            (no segment layout, e.g. a resent conversation history).
        form: "block" (fused kernel) or "query" (exact per-query window, masked).
    """

    enabled: bool = True
    global_tokens: int = 8192
    window_tokens: int = 8192
    dense_tail: int = 2048
    continuation_tail: int = 128
    form: str = "block"

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"window form must be one of {FORMS}, got {self.form!r}")
        for name in ("global_tokens", "window_tokens", "dense_tail", "continuation_tail"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def dense_from(self, segments: Sequence[SegmentLike]) -> int:
        """First dense position of a segment layout.

        Args:
            segments: The request's segments (`engine.request.SegmentLike`).

        Returns:
            The end of the leading run of stable, not dense segments (system,
            tools, map, files) minus `dense_tail` (0 when approximation is
            disabled: everything dense).
        """
        if not self.enabled:
            return 0
        stable_end = 0
        for seg in segments:
            kind = segment_kind(seg)
            if not kind.stable or kind.dense:
                break
            stable_end += len(seg.token_ids)
        return max(0, stable_end - self.dense_tail)

    def dense_from_ids(self, n_tokens: int) -> int:
        """First dense position of a plain token prompt of `n_tokens`."""
        return max(0, n_tokens - self.continuation_tail) if self.enabled else 0

    def layout_key(self, boundary: int, dense_from: int) -> int:
        """The one layout number the state over [0, boundary) depends on."""
        return min(boundary, dense_from) if self.enabled else 0

    def cache_policy_fields(self) -> dict:
        """`engine.policy.CachePolicy` keyword arguments describing this policy.

        Disabled (exact attention) gives the same fields as no window policy at
        all, so exact attention keeps one fingerprint however it was asked for.
        """
        if not self.enabled:
            return {}
        return dict(approximation=True, global_tokens=self.global_tokens,
                    window_tokens=self.window_tokens, dense_tail=self.dense_tail,
                    continuation_tail=self.continuation_tail, window_form=self.form,
                    dense_kinds=DENSE_KINDS)

    def fingerprint_fields(self) -> dict:
        """Fields for the checkpoint policy fingerprint (G, W, tails, form)."""
        if not self.enabled:
            return {"approximation": False}
        return {"approximation": True, **{k: v for k, v in asdict(self).items() if k != "enabled"}}


@dataclass(frozen=True)
class _Plan:
    """Keys a chunk sees: [0, cut_start) + [cut_end, end); `masked` = per-query mask."""

    cut_start: int
    cut_end: int
    masked: bool

    @property
    def dense(self) -> bool:
        return self.cut_start == self.cut_end and not self.masked


_DENSE = _Plan(0, 0, False)


class WindowKVCache:
    """An attention KV cache that applies a `WindowPolicy` during prefill.

    Speaks mlx-lm's cache vocabulary (`update_and_fetch`, `make_mask`, `trim`, `is_trimmable`, `offset`, `state`,
    `meta_state`, `nbytes`) so it replaces `KVCache` in any model. Over full-precision storage with the policy
    disabled (or `dense_from` 0, the default) it computes exactly what `KVCache` computes.

    Args:
        policy: The window policy.
        store: Where keys and values live (full precision or 8-bit).
        dense_from: Positions >= this attend densely.
    """

    def __init__(self, policy: WindowPolicy, store: KVStore | None = None, dense_from: int = 0):
        self.policy = policy
        self.store: KVStore = store if store is not None else DenseKVStore()
        self.dense_from = dense_from
        self.offset = 0
        self._direct = False  # last fetch returned 8-bit triples (see QuantizedWindowKVCache.bits)

    def plan(self, start: int, n: int) -> _Plan:
        """Which keys the chunk of queries [start, start + n) attends to."""
        p = self.policy
        if not p.enabled or n < 1:
            return _DENSE
        G, W = p.global_tokens, p.window_tokens
        if p.form == "block":
            if start + n <= self.dense_from and start - W > G:
                return _Plan(G, start - W, False)
            return _DENSE
        last_windowed = min(start + n, self.dense_from) - 1
        if last_windowed < start or last_windowed - W <= G:
            return _DENSE
        # Keys before the first query's window are skipped unless a dense query needs them.
        cut_end = max(G, start - W) if start + n <= self.dense_from else G
        return _Plan(G, cut_end, True)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        """The mask for the next `N` queries, matching what `update_and_fetch` returns."""
        if window_size is not None:
            raise ValueError("WindowKVCache serves full-attention layers; sliding layers keep their own cache")
        plan = self.plan(self.offset, N)
        if plan.masked:
            return self._query_mask(N, plan)
        if N == 1 and not return_array:
            return None
        before = self.offset - (plan.cut_end - plan.cut_start)
        return create_causal_mask(N, before) if return_array else "causal"

    def _query_mask(self, N: int, plan: _Plan) -> mx.array:
        """Exact per-query window over the keys [0, cut_start) + [cut_end, offset + N)."""
        G, W = self.policy.global_tokens, self.policy.window_tokens
        q = mx.arange(self.offset, self.offset + N)[:, None]
        k = mx.concatenate([mx.arange(plan.cut_start), mx.arange(plan.cut_end, self.offset + N)])[None]
        sees = (k < G) | (k >= q - W) | (q >= self.dense_from)
        return (k <= q) & sees

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Store a chunk's keys/values and return the keys/values it attends to."""
        start, n = self.offset, keys.shape[2]
        plan = self.plan(start, n)
        # Our kernel reads the 8-bit rows where they lie (engine.decode_kernels); the row may be written in
        # place only on this fetch, where that kernel is the one reader (engine.cuda_kv_write).
        ours = self.store.quantized and plan.dense and n == 1 and decode_kernels.attention_on()
        self.store.write(start, keys, values, in_place=ours and decode_kernels.kv_write_on())
        self.offset = start + n
        if ours:
            self._direct = True
            return self.store.rows(self.offset)
        if (self.store.quantized and plan.dense and 1 < n <= decode_kernels.CHUNK_MAX_ROWS
                and decode_kernels.chunk_q8_on() and cuda_chunk_attention.q8_rows_problem(
                    keys.shape[-1], self.store.bits, self.store.group_size, keys.dtype) is None):
            self._direct = True  # a short chunk over the 8-bit rows: our chunk kernel reads them where they lie
            return tuple(decode_kernels.Q8Chunk(t) for t in self.store.read_quantized(self.offset))
        self._direct = (self.store.quantized and plan.dense and n <= DIRECT_QUERY_LIMIT
                        and direct_attention_works(n, keys.shape[1], keys.shape[-1], keys.dtype, self.store.bits,
                                                   self.store.group_size, str(mx.default_device())))
        if self._direct:
            return self.store.read_quantized(self.offset)
        if plan.cut_start == plan.cut_end:
            return self.store.read(0, self.offset)
        gk, gv = self.store.read(0, plan.cut_start)
        wk, wv = self.store.read(plan.cut_end, self.offset)
        return mx.concatenate([gk, wk], axis=2), mx.concatenate([gv, wv], axis=2)

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.offset == 0

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Forget the last `n` positions (they are overwritten by the next write)."""
        n = min(self.offset, n)
        self.offset -= n
        return n

    @property
    def nbytes(self) -> int:
        return self.store.nbytes

    @property
    def state(self) -> tuple[mx.array, ...]:
        """Arrays holding positions [0, offset) (2 for full precision, 6 for 8-bit)."""
        return self.store.state(self.offset)

    @state.setter
    def state(self, arrays: tuple[mx.array, ...]) -> None:
        self.offset = self.store.load(tuple(arrays))

    def make_room(self, rows: int, ahead: int = 0) -> list[mx.array]:
        """Where `rows` positions past the offset do not fit, grow the buffers (the rows before the offset copied) to
        fit `ahead` more, in 256-position steps; the new buffers ([] where they fit or there are none yet)."""
        buffer = self.written()[:1]
        if not buffer or buffer[0].shape[2] >= self.offset + rows:
            return []
        self.store.reserve(self.offset + rows + ahead, keep=self.offset)
        return self.written()

    def written(self) -> list[mx.array]:
        """The store's whole buffers, for evaluating what a forward wrote (`engine.generate.prefill`): unlike
        `state`, no views handed out, so the store still holds them alone and the next decode step's row may be
        written in place (`engine.qkv.QuantizedKVStore.in_place_ready`)."""
        if self.store.keys is None:
            return []
        keys, values = self.store.buffers()
        return [*keys, *values] if self.store.quantized else [keys, values]

    @property
    def meta_state(self) -> tuple[str, ...]:
        """Strings naming dense_from, the policy and the storage (see `restore_window_cache`)."""
        p, store = self.policy, self.store
        bits, group = (store.bits, store.group_size) if store.quantized else (16, 0)
        return (str(self.dense_from), str(int(p.enabled)), str(p.global_tokens), str(p.window_tokens),
                str(p.dense_tail), str(p.continuation_tail), p.form, str(bits), str(group))

    @meta_state.setter
    def meta_state(self, v: Sequence[str]) -> None:
        dense_from, enabled, g, w, tail, cont, form = v[:7]
        self.dense_from = int(dense_from)
        self.policy = WindowPolicy(bool(int(enabled)), int(g), int(w), int(tail), int(cont), form)


class QuantizedWindowKVCache(WindowKVCache):
    """`WindowKVCache` over 8-bit storage.

    mlx-lm's attention (models/base.py) picks its quantized path by
    `hasattr(cache, "bits")`. `bits` therefore exists only right after a
    fetch that returned 8-bit triples (decode-sized chunks); prefill chunks
    get dequantized slices and the fused kernel.
    """

    def __init__(self, policy: WindowPolicy, bits: int = 8, group_size: int = 64, dense_from: int = 0):
        super().__init__(policy, QuantizedKVStore(bits, group_size), dense_from)
        self.group_size = group_size
        self.kv_bits = bits

    @property
    def bits(self) -> int:
        if not self._direct:
            raise AttributeError("bits: the last fetch returned dequantized keys")
        return self.kv_bits


class SlidingKVCache(WindowKVCache):
    """A sliding-window layer's cache (Gemma 3's local layers), every position kept.

    mlx-lm gives such layers a `RotatingKVCache`, a ring that overwrites keys
    older than the window; checkpoints, rollback and the archive copy and trim
    caches by position (engine/state.py), which a ring cannot do. This cache keeps
    every position and hands each chunk only the keys its queries may see, so
    the layer computes what it computes over the ring: query q attends to keys
    (q - size, q]. It costs the memory of a full-attention layer's cache.

    Args:
        size: The window: a query sees itself and the `size - 1` keys before it.
        store: Where keys and values live (full precision or 8-bit).
    """

    def __init__(self, size: int, store: KVStore | None = None) -> None:
        super().__init__(WindowPolicy(enabled=False), store)
        self.size = size

    def _first_key(self, start: int) -> int:
        return max(0, start - self.size + 1)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        """The mask for the next `N` queries over the keys `update_and_fetch` will return."""
        if N == 1 and not return_array:
            return None  # one query sees exactly the keys returned
        q = mx.arange(self.offset, self.offset + N)[:, None]
        k = mx.arange(self._first_key(self.offset), self.offset + N)[None]
        return (k <= q) & (k > q - self.size)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Store a chunk's keys/values; return those its queries see (never 8-bit triples)."""
        start = self.offset
        self.store.write(start, keys, values)
        self.offset = start + keys.shape[2]
        self._direct = False
        return self.store.read(self._first_key(start), self.offset)


def sliding_cache(ring: RotatingKVCache, kv_bits: int, group_size: int) -> SlidingKVCache:
    """The position-addressed cache that replaces mlx-lm's ring for a sliding-window layer.

    Raises:
        ValueError: The ring keeps leading tokens (an attention sink), which this cache does not model.
    """
    if ring.keep:
        raise ValueError(f"a sliding-window cache keeping {ring.keep} leading tokens is not supported")
    return SlidingKVCache(ring.max_size, QuantizedKVStore(kv_bits, group_size) if kv_bits == 8 else None)


def make_window_cache(model: nn.Module, policy: WindowPolicy, kv_bits: int = 16,
                      group_size: int = 64) -> list:
    """Per-layer caches for `model` with the window policy on its attention layers.

    Layers whose default cache is mlx-lm's `KVCache` get a `WindowKVCache`
    (kv_bits 16: model dtype) or `QuantizedWindowKVCache` (kv_bits 8);
    sliding-window layers (`RotatingKVCache`) get a `SlidingKVCache` of their
    window; other caches (recurrent `ArraysCache`) are kept.

    Raises:
        ValueError: kv_bits is not 16 or 8.
    """
    if kv_bits not in (16, 8):
        raise ValueError(f"kv_bits must be 16 or 8, got {kv_bits}")
    base = model.make_cache() if hasattr(model, "make_cache") else [KVCache() for _ in model.layers]

    def replace(cache):
        if type(cache) is RotatingKVCache:
            return sliding_cache(cache, kv_bits, group_size)
        if type(cache) is not KVCache:
            return cache
        if kv_bits == 8:
            return QuantizedWindowKVCache(policy, 8, group_size)
        return WindowKVCache(policy)

    return [replace(c) for c in base]


def restore_window_cache(state: Sequence[mx.array], meta_state: Sequence[str]) -> WindowKVCache:
    """Rebuild a cache from its `state` and `meta_state` (e.g. loaded from disk)."""
    bits, group = int(meta_state[7]), int(meta_state[8])
    cache = QuantizedWindowKVCache(WindowPolicy(), bits, group) if bits != 16 else WindowKVCache(WindowPolicy())
    cache.meta_state = meta_state
    cache.state = tuple(state)
    return cache


def set_dense_from(caches: Sequence[Any], dense_from: int) -> None:
    """Set the first dense position on every window cache of a model (call before prefill)."""
    for cache in caches:
        if isinstance(cache, WindowKVCache):
            cache.dense_from = dense_from
