"""The load-time measurements of the chunk attention (`engine.cuda_chunk_attention`), behind `engine.decode_choice`:
a forward of 2..`decode_kernels.CHUNK_MAX_ROWS` tokens (a question, a header, a verify forward) attending a long
cache, timed against the path it replaces and checked first against float32 attention.

- ``attention_chunk``: `CHUNK_ROWS` queries over a bf16 cache against MLX's attention;
- ``attention_chunk_q8``: the same over an 8-bit store's rows as they lie (the kernel widens each tile in
  shared memory) against what the engine does otherwise: the rows dequantized (`engine.cuda_dequant.rows_of`,
  as the store reads them) and attended by the faster of MLX's attention and the bf16 chunk kernel.

Each evaluation is a forward's `CHUNK_CALLS` layers at a key count not met before in the process
(`fresh_key_counts`): MLX's cuDNN attention builds a plan for each, as every chunk of a growing prompt makes it.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

import mlx.core as mx

from engine import cuda_dequant, decode_kernels
from engine.decode_measure import ATTENTION_KEYS, Timings, attention_shape, check_close, compute_dtype
from engine.timing import best_seconds

logger = logging.getLogger(__name__)

CHUNK_ROWS = decode_kernels.CHUNK_MAX_ROWS  # the chunk attention is timed at the most queries it takes
CHUNK_CALLS = 64  # a forward's layers: one evaluation at one new key count

_chunk_measurements = itertools.count()


def fresh_key_counts(n: int = 512) -> range:
    """`n` key counts from `ATTENTION_KEYS` on that no earlier call in this process handed out. MLX's cuDNN
    attention keeps the plan it builds for each key count, so a chunk-attention measurement over counts an
    earlier one met would time MLX without that cost, which every chunk of a growing prompt pays (on the
    H200 a 64-layer model measured after a 4-layer one timed MLX at 0.13 ms a call against 1.04)."""
    start = ATTENTION_KEYS + n * next(_chunk_measurements)
    return range(start, start + n)


def measure(model: Any, wirable: bool) -> Timings:
    """``attention_chunk`` where the attention modules can be wired (the wired call is where the bf16 chunk
    kernel runs, `engine.compute`) and ``attention_chunk_q8`` (reached through mlx-lm's quantized attention,
    `engine.decode_kernels.install`), on `model`'s heads; left out where the shape is not the kernel's or it
    fails its check (or to compile)."""
    shape = attention_shape(model)
    if shape is None:
        return {}
    heads, kv_heads, dim = shape
    dtype = compute_dtype(model)
    timings = time_chunk_attention(heads, kv_heads, dim, dtype) if wirable else {}
    timings.update(time_chunk_attention(heads, kv_heads, dim, dtype, eight_bit=True,
                                        bf16_kernel="attention_chunk" in timings))
    return timings


def time_chunk_attention(heads: int, kv_heads: int, dim: int, dtype: mx.Dtype, eight_bit: bool = False,
                         bf16_kernel: bool = False) -> Timings:
    """"attention_chunk" (`eight_bit`: "attention_chunk_q8", against the rows dequantized and attended by MLX or,
    where `bf16_kernel` won, the faster of MLX and that kernel): `CHUNK_ROWS` queries, a forward's `CHUNK_CALLS`
    layers per evaluation, each evaluation at a key count not seen before in the process (`fresh_key_counts`)."""
    from engine import cuda_chunk_attention as chunk

    name = "attention_chunk_q8" if eight_bit else "attention_chunk"
    if chunk.shape_problem(CHUNK_ROWS, heads // kv_heads, dim, dtype) is not None:
        return {}
    scale, fresh = dim ** -0.5, fresh_key_counts()
    kv = [mx.random.normal((1, kv_heads, fresh.stop, dim), key=mx.random.key(3 + i)).astype(dtype)
          for i in range(2)]
    if eight_bit:  # as an 8-bit store holds them (quantized from the same values)
        kv = [tuple(mx.quantize(a, group_size=64, bits=8)) for a in kv]
    queries = mx.random.normal((1, heads, CHUNK_ROWS, dim), key=mx.random.key(5)).astype(dtype)
    mx.eval(kv, queries)
    counts = iter(fresh)

    def rows(n: int) -> list[mx.array]:
        """The first `n` keys and values as the path without the 8-bit kernel attends them."""
        if not eight_bit:
            return [a[..., :n, :] for a in kv]
        return [cuda_dequant.rows_of(*(a[..., :n, :] for a in triple), bits=8, group_size=64)  # as the store reads
                for triple in kv]

    def mlx() -> list[mx.array]:
        n = next(counts)
        return [mx.fast.scaled_dot_product_attention(queries, *rows(n), scale=scale, mask="causal")
                for _ in range(CHUNK_CALLS)]

    def bf16_kernel_on_rows() -> list[mx.array]:
        n = next(counts)
        return [chunk.chunk_attention(queries, *rows(n), n, scale) for _ in range(CHUNK_CALLS)]

    def ours() -> list[mx.array]:
        n = next(counts)
        return [chunk.chunk_attention(queries, kv[0], kv[1], n, scale) for _ in range(CHUNK_CALLS)]

    try:  # a count of whole tiles, and one whose last tile is part full (past the counts the timings reach)
        for n in (fresh.start, fresh.stop - 9):
            check_close(name, chunk.chunk_attention(queries, kv[0], kv[1], n, scale),
                        chunk.reference(queries, kv[0], kv[1], n, scale))
        alternatives: list[Callable[[], list[mx.array]]] = [mlx] + ([bf16_kernel_on_rows] if bf16_kernel else [])
        baseline = min(best_seconds(f) for f in alternatives)
        return {name: (baseline / CHUNK_CALLS, best_seconds(ours) / CHUNK_CALLS)}
    except Exception as err:  # noqa: BLE001 - the newest kernels: left out, not fatal
        logger.warning("decode kernels: %s; not using it", err)
        return {}


def check_chunk_one_query(model: Any) -> None:
    """The chunk kernel's one query over a bf16 cache (a traced bf16 step's call) against MLX's attention, on
    `model`'s heads at a key count inside the buffers. Raises RuntimeError where they differ."""
    from engine import cuda_chunk_attention as chunk

    heads, kv_heads, dim = attention_shape(model)
    dtype, n = compute_dtype(model), ATTENTION_KEYS - 100
    kv = [mx.random.normal((1, kv_heads, ATTENTION_KEYS, dim), key=mx.random.key(40 + i)).astype(dtype)
          for i in range(2)]
    query = mx.random.normal((1, heads, 1, dim), key=mx.random.key(42)).astype(dtype)
    check_close("attention_chunk", chunk.chunk_attention(query, *kv, mx.array([n], dtype=mx.int32), dim ** -0.5),
                chunk.reference(query, *kv, n, dim ** -0.5), "kernel's one query")
