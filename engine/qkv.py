"""Key/value storage for attention caches: full precision or 8-bit.

`WindowKVCache` (engine/window.py) keeps its keys and values in one of these
stores and asks it for slices. `DenseKVStore` holds them as they come (the
model's dtype); `QuantizedKVStore` holds them quantized (8 bits, group 64:
about 0.53x the bytes of float16) and hands out dequantized slices, so
prefill attention still runs through the fused
`mx.fast.scaled_dot_product_attention` kernel over only the slices a chunk
needs. mlx-lm's own `QuantizedKVCache` instead attends with
`quantized_matmul`, which materializes the whole score matrix; that path is
used here only for decode-sized query counts, where it reads the 8-bit
history directly and measured faster than dequantizing it, and only where the
backend implements that product for the query count: MLX's CUDA backend had
no kernel for 5 queries over 24,621 8-bit keys (docs/benchmarks.md, *GPU
engine*), so `direct_attention_works` tries each count once per process.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from engine import cuda_dequant, cuda_kv_write
from engine.decode_kernels import Q8Rows

logger = logging.getLogger(__name__)

_STEP = 256  # storage grows in multiples of this many positions (as mlx-lm's KVCache)
_PROBE_KEYS = 4099  # an odd key count, sliced from a larger buffer as `read_quantized` slices


@functools.lru_cache(maxsize=None)
def direct_attention_works(rows: int, kv_heads: int, dim: int, dtype: mx.Dtype, bits: int, group_size: int,
                           device: str) -> bool:
    """Whether mlx-lm's quantized attention runs `rows` queries over 8-bit keys on `device` (tried once).

    The probe has what makes the real call hardest for a backend: several KV heads with
    two query heads each (a batched product), an odd key count, and keys sliced from a
    larger buffer (rows strided across heads), as `QuantizedKVStore.read_quantized` returns them.

    Args:
        device: ``str(mx.default_device())``: part of the cache key only.
    """
    from mlx_lm.models.base import quantized_scaled_dot_product_attention

    heads = max(2, kv_heads)
    buffer = mx.random.normal((1, heads, capacity(_PROBE_KEYS), dim), key=mx.random.key(0)).astype(dtype)
    packed = tuple(a[..., :_PROBE_KEYS, :] for a in mx.quantize(buffer, group_size=group_size, bits=bits))
    queries = mx.zeros((1, 2 * heads, rows, dim), dtype=dtype)
    try:
        mx.eval(quantized_scaled_dot_product_attention(queries, packed, packed, 1.0, "causal" if rows > 1 else None,
                                                       group_size, bits))
    except (RuntimeError, ValueError) as err:
        logger.info("8-bit KV: %d queries attend over dequantized slices on %s (%s)", rows, device, err)
        return False
    return True


ROOM_AHEAD = 4096
"""Positions of room the engine keeps in its window caches' buffers past the rows a request needs. A prefill that
must grow them grows them to its prompt and this much more (`engine.generate.make_room`); rows a restore appends
come with it (`engine.state.append_kv_spans`); between requests the worker grows them to this much past the offset
where fewer than half are left (`engine.prefix_cache.PrefixCache.settle`); a decode step or a speculative round's
verify that would write past them makes it first (`engine.generate.keep_room`); never past the model's context.
Where MLX's attention runs in the traced decode step over window caches (Metal; the CPU with MLX's attention) it
attends over the whole buffers through a mask, room included, so there the path keeps none (`Room.ahead` 0 from
`engine.compute.ComputePath.room_ahead`, the ``compute.room`` setting: 24-73% a step on the CPU,
`bench/room_mask.py`).
(The load-time timing of the traced step still grows them by 256 positions: it runs over buffers of its own rows,
where more room would time more empty key splits than the engine's long contexts have.)
A write past the buffers grows them over the whole history inside the forward that makes it (28-33 ms at 131,072
rows of a 64-layer 8-bit cache on an H100, `bench/gpu_grow.py`; docs/benchmarks.md, thirty-third session), and
each new capacity is a new trace of the decode step (`engine.compiled`: a request's first token gap there was 49-94
ms with one, 26-42 without, thirty-fourth session). Once half is used, 4,096 positions still hold an edited file
of about 2,000 tokens with its question and answer. By the store's sizes they cost a Qwen3-32B-shaped cache 0.57
GB at 8 bits (2.2 KB a position and layer: run g's 285 MB a layer over 131,072 rows) and 1.07 GB at bf16. A
prefill makes its room at its first chunk, so a cancelled one keeps buffers for its whole prompt (reported in
`live_cache_bytes`; the next request, usually the same prompt again, writes into them)."""


@dataclass(frozen=True)
class Room:
    """How far past the rows it writes a window cache's buffers reach once they must grow.

    Args:
        ahead: Positions past the rows: `ROOM_AHEAD`, or 0 where the compute path's traced step attends over the
            whole buffers, room included (`engine.compute.ComputePath.room_ahead`), so that room would cost every
            step.
        limit: Positions the cache never holds more of (the model's context; None: not known).
    """
    ahead: int = ROOM_AHEAD
    limit: int | None = None

    def end(self, end: int) -> int:
        """Where room made for rows up to position `end` stops: `ahead` past it, never past `limit`."""
        return end + self.ahead if self.limit is None else min(end + self.ahead, self.limit)


def capacity(needed: int) -> int:
    """The positions a buffer holding `needed` is grown to: steps of 256."""
    return (needed + _STEP - 1) // _STEP * _STEP


def _grow(buf: mx.array | None, keep: int, capacity: int, like: mx.array) -> mx.array:
    """A buffer of `capacity` positions holding the first `keep` of `buf`, zeros after them.

    The kept rows are concatenated with the zero tail rather than written into a buffer of zeros: the whole
    buffer is written once, not filled and then overwritten. A write past the buffers grows them over the whole
    history: an edit's hot copy after the cached prefix, the first write after a restore from copies (a
    checkpoint's arrays end where it ends). At 131,072 rows of a 64-layer 8-bit cache (285 MB a layer) the fill was
    18 GB of the 55 GB moved, and a 45-row write's grow took 28 ms instead of 36-37 on an H100
    (`bench/gpu_grow.py`; docs/benchmarks.md, thirty-third session). The engine's worker also makes room between
    requests and a prefill makes it for its prompt (`ROOM_AHEAD`), so the live cache's next rows
    mostly land without a grow."""
    if buf is None or keep == 0:
        return mx.zeros((*like.shape[:2], capacity, like.shape[3]), like.dtype)
    tail = mx.zeros((*like.shape[:2], capacity - keep, like.shape[3]), like.dtype)
    return mx.concatenate([buf[..., :keep, :], tail], axis=2)


class KVStore(Protocol):
    """Where a cache keeps keys and values, position-addressed along axis 2."""

    quantized: bool

    def write(self, start: int, keys: mx.array, values: mx.array, in_place: bool = False) -> None:
        """Store `keys`/`values` (B, heads, n, dim) at positions [start, start + n); `in_place`: the
        caller's one reader of them in this step orders itself after `rows()`' ``after``
        (`QuantizedKVStore.write`; a store without an in-place write ignores it)."""

    def read(self, start: int, end: int) -> tuple[mx.array, mx.array]:
        """Keys and values of positions [start, end) in the model's dtype."""

    def state(self, end: int) -> tuple[mx.array, ...]:
        """The arrays holding positions [0, end), compact (for checkpoints)."""

    def load(self, arrays: tuple[mx.array, ...]) -> int:
        """Replace the contents with `state()` output; returns its length."""

    @property
    def nbytes(self) -> int:
        """Bytes allocated (not only used)."""


class DenseKVStore:
    """Keys and values kept in the dtype they arrive in."""

    quantized = False

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    def write(self, start: int, keys: mx.array, values: mx.array, in_place: bool = False) -> None:
        end = start + keys.shape[2]
        if self.keys is None or end > self.keys.shape[2]:
            cap = capacity(end)
            self.keys = _grow(self.keys, start, cap, keys)
            self.values = _grow(self.values, start, cap, values)
        self.keys[..., start:end, :] = keys
        self.values[..., start:end, :] = values

    def read(self, start: int, end: int) -> tuple[mx.array, mx.array]:
        return self.keys[..., start:end, :], self.values[..., start:end, :]

    def state(self, end: int) -> tuple[mx.array, ...]:
        if self.keys is None:
            return ()
        return self.keys[..., :end, :], self.values[..., :end, :]

    def load(self, arrays: tuple[mx.array, ...]) -> int:
        if not arrays:
            self.keys = self.values = None
            return 0
        self.keys, self.values = arrays
        return self.keys.shape[2]

    def reserve(self, end: int, keep: int | None = None) -> None:
        """Room for positions up to `end` (the buffers grow as a write would grow them), keeping the first `keep`
        rows (all by default); needs buffers."""
        if end > self.keys.shape[2]:
            cap = capacity(end)
            self.keys, self.values = (_grow(a, a.shape[2] if keep is None else keep, cap, a)
                                      for a in (self.keys, self.values))

    def buffers(self) -> tuple[mx.array, mx.array]:
        """The whole key and value buffers (a traced step's inputs, `engine.compiled`)."""
        return self.keys, self.values

    def replace(self, keys: mx.array, values: mx.array) -> None:
        """Take the buffers a traced step returned (`buffers()` with its rows written)."""
        self.keys, self.values = keys, values

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return self.keys.nbytes + self.values.nbytes


class QuantizedKVStore:
    """Keys and values quantized on write (affine, `bits` bits, groups of `group_size`).

    Each tensor is a triple (packed uint32, scales, biases), scales and biases
    in the model's dtype, as `mx.quantize` returns them. On MLX's CUDA backend a decode
    step's row may instead be quantized and written where it lies by `engine.cuda_kv_write`
    (`_in_place` says when).
    """

    quantized = True

    def __init__(self, bits: int = 8, group_size: int = 64) -> None:
        self.bits = bits
        self.group_size = group_size
        self.keys: tuple[mx.array, mx.array, mx.array] | None = None
        self.values: tuple[mx.array, mx.array, mx.array] | None = None
        self._exclusive = False  # see `_in_place`
        self._written: mx.array | None = None  # the last in-place write's output (`engine.cuda_kv_write`)
        self._kernel_takes: tuple[tuple, bool] | None = None  # (row shape, the kernel takes it: in the buffers' dtype)

    def _in_place(self, keys: mx.array, values: mx.array, end: int) -> bool:
        """Whether a write asked for in place (`write`'s `in_place`) may go through `engine.cuda_kv_write`:
        keys and values alike, and `in_place_ready` for their rows."""
        return keys.shape == values.shape and keys.dtype == values.dtype and \
            self.in_place_ready(end, tuple(keys.shape), keys.dtype)

    def in_place_ready(self, end: int, row: tuple[int, ...] | None = None, dtype: mx.Dtype | None = None) -> bool:
        """Whether rows of shape `row` in `dtype` ending at `end` may be written in place by `engine.cuda_kv_write`
        (default: one row of the buffers' heads and dim in their dtype, as a decode step writes it).

        For rows the kernel takes, in the buffers' dtype, that fit the buffers, and only into buffers nothing
        but the store holds (`_exclusive`, which also means they exist): a slice update's output is the
        store's alone (MLX copied the buffer or reused memory nobody else held); `state` hands out views (a
        checkpoint's copy, an evaluation) and `load` takes arrays from outside, so after either the next
        write is a slice update again. The views `read`, `read_quantized` and `rows`, and the buffers
        `buffers` hands out, are used up inside the forward that asked for them.
        """
        if not (self._exclusive and end <= self.keys[0].shape[2]):
            return False
        packed = self.keys[0].shape
        row = row or (1, packed[1], 1, packed[3] * 32 // self.bits)
        if (dtype or self.keys[1].dtype) != self.keys[1].dtype:
            return False
        if self._kernel_takes is None or self._kernel_takes[0] != row:  # asked once per row shape, not per step
            rows = mx.zeros(row, dtype=self.keys[1].dtype)  # (never evaluated: the kernel's check reads its shape)
            self._kernel_takes = (row, cuda_kv_write.shape_problem(rows, self.bits, self.group_size) is None)
        return self._kernel_takes[1]

    def _quantize(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        if x.shape[-1] % self.group_size:
            raise ValueError(
                f"head dim {x.shape[-1]} is not a multiple of the KV group size {self.group_size}"
            )
        return mx.quantize(x, group_size=self.group_size, bits=self.bits)

    def _dequantize(self, q: tuple[mx.array, ...], start: int, end: int) -> mx.array:
        parts = [a[..., start:end, :] for a in q]
        return cuda_dequant.rows_of(*parts, bits=self.bits, group_size=self.group_size)  # (MLX's on the CPU)

    def write(self, start: int, keys: mx.array, values: mx.array, in_place: bool = False) -> None:
        """Quantize and store the rows; `in_place`: the caller's one reader of them in this step takes
        `rows()`' ``after`` as an input (`engine.window.WindowKVCache` asks it for our attention only),
        so a decode row may be written by `engine.cuda_kv_write` where that applies (`_in_place`)."""
        end = start + keys.shape[2]
        if in_place and self._in_place(keys, values, end):
            self.keys, self.values, self._written = cuda_kv_write.write_q8_ordered(
                self.keys, self.values, keys, values, start, self.group_size)
            return
        self._written = None
        qk, qv = self._quantize(keys), self._quantize(values)
        if self.keys is None or end > self.keys[0].shape[2]:
            cap = capacity(end)
            old_k = self.keys or (None, None, None)
            old_v = self.values or (None, None, None)
            self.keys = tuple(_grow(o, start, cap, n) for o, n in zip(old_k, qk))
            self.values = tuple(_grow(o, start, cap, n) for o, n in zip(old_v, qv))
        for buf, new in zip((*self.keys, *self.values), (*qk, *qv)):
            buf[..., start:end, :] = new
        self._exclusive = True

    def read(self, start: int, end: int) -> tuple[mx.array, mx.array]:
        return self._dequantize(self.keys, start, end), self._dequantize(self.values, start, end)

    def read_quantized(self, end: int) -> tuple[tuple[mx.array, ...], tuple[mx.array, ...]]:
        """The 8-bit triples of positions [0, end), for `quantized_matmul` attention."""
        cut = lambda q: tuple(a[..., :end, :] for a in q)  # noqa: E731
        return cut(self.keys), cut(self.values)

    def rows(self, end: int) -> tuple[Q8Rows, Q8Rows]:
        """The 8-bit buffers unsliced, marked as holding `end` rows (for `engine.cuda_attention`), the keys'
        with the last in-place write's output when the last write was one (the kernel must run after it)."""
        return Q8Rows(self.keys, end, self._written), Q8Rows(self.values, end)

    def state(self, end: int) -> tuple[mx.array, ...]:
        if self.keys is None:
            return ()
        self._exclusive = False
        return tuple(a[..., :end, :] for a in (*self.keys, *self.values))

    def load(self, arrays: tuple[mx.array, ...]) -> int:
        self._exclusive, self._written = False, None
        if not arrays:
            self.keys = self.values = None
            return 0
        self.keys, self.values = tuple(arrays[:3]), tuple(arrays[3:])
        return self.keys[0].shape[2]

    def reserve(self, end: int, keep: int | None = None) -> None:
        """Room for positions up to `end` (the buffers grow as a write would grow them), keeping the first `keep`
        rows (all by default); needs buffers."""
        if end > self.keys[0].shape[2]:
            cap = capacity(end)
            self.keys, self.values = (tuple(_grow(a, a.shape[2] if keep is None else keep, cap, a) for a in q)
                                      for q in (self.keys, self.values))
            self._exclusive, self._written = True, None

    def buffers(self) -> tuple[tuple[mx.array, ...], tuple[mx.array, ...]]:
        """The whole (packed, scales, biases) buffers of keys and values (a traced step's inputs; like the
        views `read` hands out, used up inside that step, so the buffers stay the store's alone)."""
        return self.keys, self.values

    def replace(self, keys: tuple[mx.array, ...], values: tuple[mx.array, ...]) -> None:
        """Take the buffers a traced step returned (`engine.compiled`), the store's alone: every layer of a
        step writes its row, so they are its slice updates' outputs, or aliases of buffers written in place,
        which a traced step does only into buffers that were the store's alone
        (`engine.trace_caches.layer_buffers`)."""
        self.keys, self.values = tuple(keys), tuple(values)
        self._exclusive, self._written = True, None

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(a.nbytes for a in (*self.keys, *self.values))
