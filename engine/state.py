"""Snapshot and restore of per-layer cache state.

A model's cache is a list with one object per layer, of two kinds:

* **attention** layers (mlx-lm `KVCache`, `QuantizedKVCache` and subclasses
  with the same vocabulary) hold keys/values up to `offset` and are
  trimmable: going back to an earlier boundary is `trim`, O(1).
* **recurrent** layers (mlx-lm `ArraysCache`: Gated DeltaNet / Mamba state)
  hold a fixed-size summary of everything seen; they cannot be trimmed, so
  their arrays are snapshotted at every boundary.

State travels as flat ``{name: mx.array}`` dicts (names like ``"3.k.0"``),
the same form in memory and in the archive's safetensors files.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

from engine.qkv import capacity

Arrays = dict[str, mx.array]


@runtime_checkable
class AttentionLayerCache(Protocol):
    """The trimmable KV vocabulary shared by mlx-lm's attention caches."""

    offset: int

    def is_trimmable(self) -> bool: ...

    def trim(self, n: int) -> int: ...


class StateError(ValueError):
    """A cache that cannot be snapshotted or restored as asked."""


def is_recurrent(layer: Any) -> bool:
    """True for layers whose state is a snapshot, not a trimmable sequence."""
    return isinstance(layer, ArraysCache)


def attention_offset(cache: Sequence[Any]) -> int:
    """Tokens held by the attention layers (all must agree; 0 when none)."""
    offsets = {int(c.offset) for c in cache if not is_recurrent(c)}
    if len(offsets) > 1:
        raise StateError(f"attention layers disagree on their offset: {sorted(offsets)}")
    return offsets.pop() if offsets else 0


def trim_to(cache: Sequence[Any], offset: int) -> None:
    """Move every attention layer back to `offset` tokens (recurrent layers untouched).

    Raises:
        StateError: If a layer is not trimmable or holds fewer than `offset` tokens.
    """
    for i, c in enumerate(cache):
        if is_recurrent(c):
            continue
        if not (isinstance(c, AttentionLayerCache) and c.is_trimmable()):
            raise StateError(f"layer {i} ({type(c).__name__}) cannot be trimmed")
        if c.offset < offset:
            raise StateError(f"layer {i} holds {c.offset} tokens, cannot trim to {offset}")
        c.trim(c.offset - offset)


def _kv_parts(layer: Any) -> list[mx.array]:
    """The arrays holding a layer's keys/values, positions on axis -2.

    mlx-lm's own caches expose their (possibly larger) buffers; any other
    attention cache (e.g. `engine.window.WindowKVCache`) gives its `state`:
    arrays covering exactly [0, offset).
    """
    if isinstance(layer, QuantizedKVCache):
        return [*layer.keys, *layer.values]
    if isinstance(layer, KVCache):
        return [layer.keys, layer.values]
    return list(layer.state)


def _set_kv(layer: Any, parts: list[mx.array], end: int, room: int = 0) -> None:
    """Set a layer's arrays holding positions [0, end); a window cache's may hold `room` positions more."""
    if isinstance(layer, QuantizedKVCache):
        layer.state = (tuple(parts[:3]), tuple(parts[3:]), end, layer.group_size, layer.bits)
    elif isinstance(layer, KVCache):
        layer.state = (parts[0], parts[1], end)
    else:
        layer.state = tuple(parts)
        if layer.offset != end + room:
            raise StateError(f"{type(layer).__name__} took {layer.offset - room} tokens, expected {end}")
        layer.offset = end


def _copy(x: mx.array) -> mx.array:
    # A slice is a view that keeps the whole live buffer alive; own the bytes.
    return mx.contiguous(x)


def copy_kv_span(cache: Sequence[Any], start: int, end: int) -> Arrays:
    """Copies of every attention layer's keys/values for positions [start, end)."""
    span: Arrays = {}
    for i, c in enumerate(cache):
        if is_recurrent(c) or end <= start:
            continue
        if c.offset < end:
            raise StateError(f"layer {i} holds {c.offset} tokens, span ends at {end}")
        for j, part in enumerate(_kv_parts(c)):
            span[f"{i}.kv.{j}"] = _copy(part[..., start:end, :])
    mx.eval(list(span.values()))
    return span


def append_kv_span(cache: Sequence[Any], span: Arrays, length: int) -> None:
    """Write a span copied by `copy_kv_span` after each attention layer's offset.

    Args:
        cache: The live cache; its attention layers all hold the same offset.
        span: Arrays from `copy_kv_span` (or the archive) covering `length` tokens.
        length: Tokens in the span.

    Raises:
        StateError: If the span does not fit the cache's layers.
    """
    append_kv_spans(cache, [(span, length)])


def append_kv_spans(cache: Sequence[Any], spans: Sequence[tuple[Arrays, int]], room_until: int = 0) -> None:
    """Write consecutive spans (each `(arrays, length)`) in one copy per layer; a window cache's copy has room up to
    position `room_until` (`engine.generate.make_room` would otherwise copy its history again for the next rows).

    Raises:
        StateError: If a span does not fit the cache's layers.
    """
    spans = [(span, n) for span, n in spans if n > 0]
    if not spans:
        return
    for i, c in enumerate(cache):
        if is_recurrent(c):
            continue
        pieces = []
        for span, length in spans:
            names = sorted((k for k in span if k.startswith(f"{i}.kv.")),
                           key=lambda k: int(k.rsplit(".", 1)[1]))
            parts = [span[k] for k in names]
            if not parts or parts[0].shape[-2] != length:
                raise StateError(f"span has no {length}-token entry for layer {i}")
            pieces.append(parts)
        _append_layer(c, pieces, room_until)


def _append_layer(layer: Any, pieces: list[list[mx.array]], room_until: int = 0) -> None:
    """Append `pieces` (each the layer's arrays for consecutive positions) after `offset`; a window cache's new
    buffers end no earlier than `room_until`, zeros past the pieces."""
    prev = layer.offset
    end = prev + sum(p[0].shape[-2] for p in pieces)
    old = None if layer.empty() else _kv_parts(layer)
    if any(old is not None and len(old) != len(p) for p in pieces):
        raise StateError(f"span arrays do not match a {type(layer).__name__}")
    in_place = isinstance(layer, (KVCache, QuantizedKVCache))
    if in_place and old is not None and end <= old[0].shape[-2]:
        pos = prev
        for parts in pieces:
            n = parts[0].shape[-2]
            for buf, part in zip(old, parts):
                buf[..., pos:pos + n, :] = part
            pos += n
        layer.offset = end
        return
    grown, room = [], max(0, capacity(room_until) - end) if hasattr(layer, "make_room") else 0  # as a grow would
    for j in range(len(pieces[0])):
        chunks = ([] if old is None else [old[j][..., :prev, :]]) + [p[j] for p in pieces]
        last = chunks[-1]
        chunks += [mx.zeros((*last.shape[:-2], room, last.shape[-1]), last.dtype)] if room else []
        grown.append(chunks[0] if len(chunks) == 1 else mx.concatenate(chunks, axis=-2))
    _set_kv(layer, grown, end, room)


def snapshot_recurrent(cache: Sequence[Any]) -> Arrays:
    """The arrays of every recurrent layer, as they are now.

    mlx-lm's recurrent layers replace their arrays on every step (never write
    into them), so holding references is a snapshot; nothing is copied.
    """
    snap: Arrays = {}
    for i, c in enumerate(cache):
        if not is_recurrent(c):
            continue
        for j, x in enumerate(c.cache):
            if x is not None:
                snap[f"{i}.rec.{j}"] = x
    return snap


def restore_recurrent(cache: Sequence[Any], snapshot: Arrays) -> None:
    """Put every recurrent layer back to `snapshot` (empty state where absent)."""
    for i, c in enumerate(cache):
        if is_recurrent(c):
            c.cache = [snapshot.get(f"{i}.rec.{j}") for j in range(len(c.cache))]


def has_recurrent(cache: Sequence[Any]) -> bool:
    """True when any layer keeps recurrent state."""
    return any(is_recurrent(c) for c in cache)


def nbytes(arrays: Arrays) -> int:
    """Bytes held by the arrays of a span or snapshot."""
    return sum(int(x.nbytes) for x in arrays.values())
