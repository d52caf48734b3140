"""What a traced decode step (`engine.compiled`) sees of each layer's cache, and how it is put back.

A trace must not depend on the step: its inputs are the layer's *whole* buffers and the
position as an array, and the rows are written at that position inside the trace. The
stand-in caches below are what the model's layers call while the step is traced:

- `BufferCache`: full-precision buffers (mlx-lm's `KVCache`, or a `engine.window.WindowKVCache`
  over a `engine.qkv.DenseKVStore`): the rows written with a dynamic slice update, attention over
  the whole buffer with a mask ``position <= offset``;
- `Q8BufferCache`: the (packed, scales, biases) buffers of a `engine.qkv.QuantizedKVStore`. With
  MLX's kernels the rows are quantized and written with slice updates and attended by mlx-lm's
  quantized attention over the buffers, masked; with ours (`ours`: a one-token step on MLX's CUDA
  backend, `engine.decode_choice`'s ``step_traced``) the row is written in place
  (`engine.cuda_kv_write`) and attended by `engine.cuda_attention` with the key count as an array.

With ours over full precision (``step_traced_bf16``) the row is written by a scatter along the positions
(`scattered`: MLX's CUDA dynamic slice update costs the whole buffer) and the one query attended by `engine.cuda_chunk_attention` with the key count as an array (reached
through the attention modules' wired call, `engine.decode_kernels.attend_chunk`).

`layer_buffers` and `put_back` are the only places that know where each kind of cache keeps its
buffers.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from engine import cuda_kv_write
from engine.decode_kernels import Q8Rows
from engine.qkv import direct_attention_works
from engine.window import QuantizedWindowKVCache, WindowKVCache

Buffers = tuple[mx.array, mx.array] | dict[str, Any]
"""A layer's keys and values: two arrays (full precision), or (8-bit) a dict of the (packed, scales, biases)
triples of keys and values and the store's group size and bits."""

_GROWTH = KVCache.step


class BufferCache:
    """Stand-in for a full-precision cache while tracing: whole buffers, array offset; with `ours`, the key
    count as an array (`count`, after the write) for `engine.cuda_chunk_attention`, and no mask."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array, ours: bool = False) -> None:
        self.keys, self.values, self.offset, self.ours = keys, values, offset, ours
        self.count: mx.array | None = None

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        write = scattered if self.ours else _slice_updated
        self.keys, self.values = write(self.keys, keys, self.offset), write(self.values, values, self.offset)
        if self.ours:
            self.count = self.offset + keys.shape[2]
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        # (our chunk kernel, with `ours`, attends over the first `count` rows and reads no mask; any other
        # reader of these buffers needs it)
        return _causal_over_buffer(n, self.keys.shape[2], self.offset, window_size)

    def buffers(self) -> tuple[Any, Any]:
        return self.keys, self.values


class Q8BufferCache:
    """Stand-in for an 8-bit store's cache while tracing (see the module docstring for `ours`)."""

    def __init__(self, keys: tuple, values: tuple, group_size: int, bits: int, offset: mx.array, ours: bool) -> None:
        self.keys, self.values, self.offset = tuple(keys), tuple(values), offset
        self.group_size, self.bits, self.ours = group_size, bits, ours

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[tuple, tuple]:
        if self.ours:
            self.keys, self.values, done = cuda_kv_write.write_q8_ordered(
                self.keys, self.values, keys, values, self.offset, self.group_size)
            count = self.offset + keys.shape[2]
            return Q8Rows(self.keys, count, done), Q8Rows(self.values, count)
        new_keys, new_values = (mx.quantize(a, group_size=self.group_size, bits=self.bits) for a in (keys, values))
        self.keys = tuple(mx.slice_update(b, r, self.offset, axes=(2,)) for b, r in zip(self.keys, new_keys))
        self.values = tuple(mx.slice_update(b, r, self.offset, axes=(2,)) for b, r in zip(self.values, new_values))
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array | None:
        if self.ours:
            return None  # our kernel attends over the first `count` rows it is given
        return _causal_over_buffer(n, self.keys[0].shape[2], self.offset, window_size)

    def buffers(self) -> tuple[Any, Any]:
        return self.keys, self.values


def scattered(buffer: mx.array, rows: mx.array, offset: mx.array) -> mx.array:
    """`buffer` (B, H, capacity, D) with `rows` (B, H, n, D) written from position `offset` (an array), as a scatter
    along the positions. The trace's row write over bf16 buffers with our kernels (on MLX's CUDA backend): there a
    dynamic slice update launches a thread per element of the whole buffer, about 1 ms a layer at 131,072 rows
    (docs/benchmarks.md, fourteenth session), and by MLX's source its scatter one per element of the rows."""
    n = rows.shape[2]
    if n == 1:  # a decode step's row: the offset itself (no operation of its own in each layer: each is a launch)
        positions = offset.reshape(1, 1, 1, 1)
    else:
        positions = (offset.reshape(1) + mx.arange(n, dtype=offset.dtype)).reshape(1, 1, n, 1)
    return mx.put_along_axis(buffer, mx.broadcast_to(positions, rows.shape), rows, axis=2)


def _slice_updated(buffer: mx.array, rows: mx.array, offset: mx.array) -> mx.array:
    return mx.slice_update(buffer, rows, offset, axes=(2,))


def _causal_over_buffer(n: int, capacity: int, offset: mx.array, window_size: int | None) -> mx.array:
    if window_size is not None:
        raise ValueError("a traced step attends with full (causal) attention")
    # Query i sits at position offset + i and sees every key up to it.
    return mx.arange(capacity)[None] <= (offset + mx.arange(n))[:, None]


Ours = frozenset[str]
"""The stores a traced step with our CUDA kernels takes ("q8": 8-bit, "dense": full precision); empty: MLX's."""


def layer_buffers(cache: Any, n: int, ours: Ours = frozenset(), windows: bool = True) -> Buffers | None:
    """The layer's buffers as a traced step of `n` tokens takes them, with room for the rows (grown as the
    layer's own write would grow them), or None where it cannot take them: a cache of another kind (with
    `windows` off, any but mlx-lm's `KVCache`), no buffers yet, positions the window policy does not
    attend densely; with `ours`, anything but one row into a store of a kind in `ours`, and for an 8-bit
    one a row it may write in place (`engine.qkv.QuantizedKVStore.in_place_ready`: the buffers its alone,
    a row the kernel takes); without, an 8-bit store whose query count MLX's quantized attention cannot
    take here (`engine.qkv.direct_attention_works`, as the layer's own fetch asks). An 8-bit store's
    buffers come with its group size and bits (constants of the trace)."""
    if type(cache) is KVCache:
        if ours or cache.keys is None:
            return None
        _grow_kv_cache(cache, n)
        return cache.keys, cache.values
    store = getattr(cache, "store", None)
    if not windows or type(cache) not in (WindowKVCache, QuantizedWindowKVCache) or store.keys is None:
        return None
    if not cache.plan(cache.offset, n).dense or (ours and (n != 1 or _kind(store) not in ours)):
        return None
    store.reserve(cache.offset + n, keep=cache.offset)  # rows past the offset are stale (a rollback's)
    if not store.quantized:
        return store.buffers()
    if ours and not store.in_place_ready(cache.offset + 1):
        return None
    packed, scales = store.keys[0], store.keys[1]
    if not ours and not direct_attention_works(n, packed.shape[1], packed.shape[3] * 32 // store.bits, scales.dtype,
                                               store.bits, store.group_size, str(mx.default_device())):
        return None
    keys, values = store.buffers()
    return {"keys": keys, "values": values, "group_size": store.group_size, "bits": store.bits}


def stand_in(buffers: Buffers, offset: mx.array, ours: Ours) -> Any:
    """The stand-in cache for one layer's `buffers` (as `layer_buffers` gave them)."""
    if isinstance(buffers, dict):
        return Q8BufferCache(**buffers, offset=offset, ours="q8" in ours)
    return BufferCache(*buffers, offset, ours="dense" in ours)


def _kind(store: Any) -> str:
    return "q8" if store.quantized else "dense"


def _grow_kv_cache(cache: KVCache, n: int) -> None:
    """Grow an mlx-lm `KVCache`'s buffers (as it would) so that `n` more rows fit."""
    if cache.offset + n <= cache.keys.shape[2]:
        return
    extra = _GROWTH * ((n + _GROWTH - 1) // _GROWTH)

    def grown(buffer: mx.array) -> mx.array:
        pad = mx.zeros((*buffer.shape[:2], extra, buffer.shape[3]), dtype=buffer.dtype)
        return mx.concatenate([buffer[..., : cache.offset, :], pad], axis=2)

    cache.keys, cache.values = grown(cache.keys), grown(cache.values)


def put_back(cache: Any, buffers: tuple[Any, Any], n: int) -> None:
    """The traced step's buffers into the layer's cache, `n` positions further: what its own call would have
    left (the same buffers with the rows written)."""
    if type(cache) is KVCache:
        cache.keys, cache.values = buffers
    else:
        cache.store.replace(*buffers)
    cache.offset += n
