"""Our CUDA decode kernels in the forward: the switches, and the one hook into mlx-lm's attention.

Two kernels replace MLX's for decode-sized inputs on MLX's CUDA backend
(`engine.cuda_qmv`: quantized linears of at most `cuda_qmv.MAX_ROWS` rows;
`engine.cuda_attention`: one query over an 8-bit KV cache). Whether they run is the
compute path's decision (`engine.compute`, measured per device and model shape
by `engine.decode_choice`); the path turns them on for its forward with `scope`,
and the layers ask `qmv_on()` / `attention_on()`:

- quantized linears: `engine.linear_mode.DequantizingLinear` (the class the path
  wires into the model's blocks) multiplies through `cuda_qmv` while `qmv_on()`;
- attention: `engine.window.QuantizedWindowKVCache` returns `Q8Rows` (the store's
  8-bit buffers and the key count, unsliced) for a one-query fetch while
  `attention_on()`; mlx-lm's attention hands them to
  ``mlx_lm.models.base.quantized_scaled_dot_product_attention``, which `install`
  replaces (once per process) by a function that sends `Q8Rows` to our kernel and
  everything else to mlx-lm's own function, unchanged;
- a short chunk's attention (`engine.cuda_chunk_attention`, forwards of 2..`CHUNK_MAX_ROWS`
  tokens, and a traced bf16 decode step's one query): the attention modules
  `engine.cpu_attention.wire` gave a wired call attend through `attend_chunk` while `chunk_on()`;
- a decode step's cache write (`engine.cuda_kv_write`): the stores of `engine.qkv` write the row
  in place while `kv_write_on()`;
- a decode step's MLPs (`engine.compiled_mlp`): replayed from their trace while `compiled_mlp.on()`;
- linears of one input (a block's q, k, v; its MLP's gate and up) in one launch each while `fused_on()`,
  and one token's per-head norms and RoPE in one launch while `rope_on()` (`engine.fused_linears`);
- a block's residual adds in its o and down projections' launches while `residual_on()` (`engine.fused_residual`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import mlx.core as mx
from mlx_lm.models import base

from engine import compiled_mlp, cuda_backend, cuda_chunk_attention
from engine.switches import Switch

_qmv = Switch("codectx_qmv_kernel")
_qmv_split = Switch("codectx_qmv_split")
_attention = Switch("codectx_attention_kernel")
_mma = Switch("codectx_attention_mma")
_staged = Switch("codectx_attention_staged")
_transposed = Switch("codectx_attention_transposed")
_chunk = Switch("codectx_attention_chunk")
_chunk_q8 = Switch("codectx_attention_chunk_q8")
_one_query = Switch("codectx_chunk_one_query")
_as_traced = Switch("codectx_split_as_traced")
_kv_write = Switch("codectx_kv_write")
_fused = Switch("codectx_qmv_fused")
_rope = Switch("codectx_rope_fused")
_residual = Switch("codectx_residual_fused")
_installed: list[Any] = []
CHUNK_MAX_ROWS = 48
"""Forwards of 2..CHUNK_MAX_ROWS tokens may take `engine.cuda_chunk_attention` (a question, a header,
a verify forward); longer chunks keep MLX's attention (cuDNN), whose plan cost a long chunk amortizes."""
qmv_on = _qmv.on
"""Whether quantized linears of decode size use `engine.cuda_qmv` on this thread now."""
qmv_split_on = _qmv_split.on
"""Whether those of few, long rows split each warp's rows over K (`engine.cuda_qmv_split`) on this thread now."""
attention_on = _attention.on
"""Whether one-query attention over an 8-bit cache uses `engine.cuda_attention` on this thread now."""
chunk_on = _chunk.on
"""Whether a short chunk's attention over a bf16 cache uses `engine.cuda_chunk_attention` on this thread now."""
chunk_q8_on = _chunk_q8.on
"""Whether a short chunk's attention over an 8-bit cache's dense rows uses `engine.cuda_chunk_attention`'s 8-bit
kernel on this thread now (the window cache then hands out the rows as they lie, `engine.window`)."""
one_query_chunk = _one_query.scope
"""Inside this block (with `chunk_on()`), a plain one-token forward over a bf16 cache attends through
`engine.cuda_chunk_attention` too, as a traced bf16 step does: the reference the traced step is checked against
(`engine.step_measure`), so that the check compares the trace and not two attention kernels."""
split_as_traced = _as_traced.scope
"""Inside this block, a plain one-token forward over an 8-bit cache splits its keys over the buffers' rows, as a
traced step does (its count an array): the reference the 8-bit trace is checked against (`engine.step_measure`), so
that the check compares the trace and not two ways of splitting the keys. (The check's failure in runs h and i,
4.86e-2 against 2e-2, had another cause: the reference's MLPs compiled apart, `engine.step_measure`; run j found the
trace and the reference computing as it does 0.0 apart, split as here: docs/benchmarks.md, sixteenth session.)"""
kv_write_on = _kv_write.on
"""Whether a one-row cache write goes through `engine.cuda_kv_write` (in place) on this thread now."""
fused_on = _fused.on
"""Whether linears of one input take one launch of `engine.cuda_qmv` (`engine.fused_linears`) on this thread now."""
rope_on = _rope.on
"""Whether one token's per-head norms and RoPE take one launch (`engine.cuda_qk_rope`) on this thread now."""
residual_on = _residual.on
"""Whether wired blocks add their residuals in their projections' launches (`engine.fused_residual`) on this thread now."""


@contextlib.contextmanager
def scope(qmv: bool, attention: bool, mma: bool = False, chunk: bool = False,
          kv_write: bool = False, mlp: bool = False, fused: bool = False, rope: bool = False,
          staged: bool = False, transposed: bool = False, chunk_q8: bool = False,
          split: bool = False, residual: bool = False) -> Iterator[None]:
    """Inside this block, the kernels asked for run (on this thread); `mma`: the attention's is
    `engine.cuda_attention_mma` (tensor cores) where the shape fits it; `staged`: it is
    `engine.cuda_attention_staged` (its bytes staged through shared memory) there; `transposed`: it is
    `engine.cuda_attention_transposed` (keys on the products' rows) there; `chunk`: attention modules
    wired by `engine.cpu_attention.wire` attend through `attend_chunk`; `kv_write`: the caches'
    stores (`engine.qkv`) write one-row chunks through `engine.cuda_kv_write`; `mlp`: wired MLPs replay
    their trace for one row (`engine.compiled_mlp`); `fused`: linears of one input take one launch
    (`engine.fused_linears`; only with `qmv`); `rope`: one token's norms and RoPE take one launch; `chunk_q8`:
    a chunk over an 8-bit cache's dense rows attends through `engine.cuda_chunk_attention`'s 8-bit kernel; `split`:
    our linears of few, long rows split their warps' rows over K (`engine.cuda_qmv_split`; only with `qmv`); `residual`:
    wired blocks add their residuals in their projections' launches (`engine.fused_residual`; only with `qmv`)."""
    if attention or chunk_q8:
        install()
    with _qmv.scope(qmv), _attention.scope(attention), _mma.scope(attention and mma), \
            _staged.scope(attention and staged), _transposed.scope(attention and transposed), _chunk.scope(chunk), \
            _kv_write.scope(kv_write), compiled_mlp.scope(mlp), _fused.scope(qmv and fused), _rope.scope(rope), \
            _chunk_q8.scope(chunk_q8), _qmv_split.scope(qmv and split), _residual.scope(qmv and residual):
        yield


def attention_kernels() -> tuple[str, ...]:
    """Our one-query attention kernels this thread's switches ask for, in the order they are tried
    (`engine.cuda_attention.decode_attention`'s names; the CUDA-core kernel takes what the others do not)."""
    return (*(("staged",) if _staged.on() else ()), *(("transposed",) if _transposed.on() else ()),
            *(("mma",) if _mma.on() else ()), "cores")


def attend_chunk(queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any) -> mx.array:
    """A chunk's attention: `engine.cuda_chunk_attention` for a dense causal chunk over a bf16 cache
    (keys and values as the cache's fetch returned them) or for a traced decode step's one query over
    a bf16 cache's whole buffers (the cache's `count`, an array: `engine.trace_caches`) or, inside
    `one_query_chunk`, a plain step's one query over a bf16 cache's rows; mlx-lm's attention for anything else (an 8-bit cache, a windowed mask, a shape the kernel does not take)."""
    B, H, L, D = queries.shape
    count = getattr(cache, "count", None)
    if isinstance(count, mx.array) and not hasattr(cache, "bits"):
        return cuda_chunk_attention.chunk_attention(queries, keys, values, count, scale)
    one_query = _one_query.on() and L == 1 and mask is None  # the reference of a traced bf16 step's check
    if (B == 1 and not hasattr(cache, "bits")  # (an 8-bit cache's keys are not one array)
            and (one_query or isinstance(mask, str) and mask == "causal" and 1 < L <= keys.shape[2])
            and cuda_chunk_attention.shape_problem(L, H // keys.shape[1], D, keys.dtype) is None):
        return cuda_chunk_attention.chunk_attention(queries, keys, values, keys.shape[2], scale)
    return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale, mask=mask)


class Q8Rows(tuple):
    """An 8-bit store's (packed, scales, biases) buffers whose first `n` rows are the keys or values (`n` an
    int32 array in a traced step, `engine.trace_caches`); `after`: the output of the in-place write of the
    last row (`engine.cuda_kv_write`) when it was one: whatever reads the buffers in the same step must
    take it as an input (MLX orders by inputs)."""

    n: int | mx.array
    after: mx.array | None

    def __new__(cls, arrays: tuple[mx.array, ...], n: int | mx.array, after: mx.array | None = None) -> "Q8Rows":
        rows = super().__new__(cls, arrays)
        rows.n, rows.after = n, after
        return rows


def q8_chunk_takes(queries: mx.array, keys: Any, values: Any, mask: Any, group_size: int, bits: int) -> bool:
    """Whether `engine.cuda_chunk_attention`'s 8-bit kernel takes a causal chunk of 2..`CHUNK_MAX_ROWS` queries
    over an 8-bit store's (packed, scales, biases) rows, the chunk's own last."""
    B, H, L, D = queries.shape
    return (B == 1 and bits == 8 and group_size == 64 and isinstance(mask, str) and mask == "causal"
            and 1 < L <= CHUNK_MAX_ROWS and L <= keys[0].shape[2]
            and cuda_chunk_attention.q8_problem(L, H // keys[0].shape[1], D, tuple(keys), tuple(values)) is None)


class Q8Chunk(tuple):
    """An 8-bit store's (packed, scales, biases) rows a window cache handed out for our chunk kernel
    (`engine.window`, while `chunk_q8_on()`): attended by it where it takes the call, else dequantized (mlx-lm's
    quantized attention may not take that many queries; other triples keep its call)."""


def install() -> None:
    """Route `Q8Rows` through our kernel in mlx-lm's quantized attention, and while `chunk_q8_on()` a short
    chunk's 8-bit rows through `engine.cuda_chunk_attention`'s 8-bit kernel (idempotent)."""
    if _installed:  # mlx-lm's own function, once replaced
        return
    from engine import cuda_attention

    original = base.quantized_scaled_dot_product_attention

    def quantized_attention(queries: mx.array, q_keys: Any, q_values: Any, scale: float, mask: Any,
                            group_size: int = 64, bits: int = 8) -> mx.array:
        if not isinstance(q_keys, Q8Rows):
            if not isinstance(q_keys, Q8Chunk):
                return original(queries, q_keys, q_values, scale, mask, group_size, bits)
            n = q_keys[0].shape[2]
            if q8_chunk_takes(queries, q_keys, q_values, mask, group_size, bits):
                return cuda_chunk_attention.chunk_attention(queries, tuple(q_keys), tuple(q_values), n, scale)
            return cuda_attention.reference(queries, q_keys, q_values, n, scale, group_size, mask, bits)
        for kernel in attention_kernels():
            if mask is None and cuda_attention.unsupported(queries, q_keys, bits, group_size, kernel) is None:
                n = cuda_backend.int32s(q_keys.n) if _as_traced.on() and isinstance(q_keys.n, int) else q_keys.n
                return cuda_attention.decode_attention(queries, q_keys, q_values, n, scale, group_size, kernel,
                                                       after=q_keys.after)
        # A shape the kernel does not take: the rows dequantized, MLX's fused attention (whose reads an
        # in-place write is not ordered before: that write is evaluated first). Not inside a trace, whose
        # count is an array: there only our kernel attends (the traced step's first call fails, and ends it).
        if isinstance(q_keys.n, mx.array):
            raise ValueError(f"a traced step's attention must be our kernel's: {mask=}, {queries.shape}")
        if q_keys.after is not None:
            mx.eval(q_keys.after)
        return cuda_attention.reference(queries, q_keys, q_values, q_keys.n, scale, group_size, mask, bits)

    base.quantized_scaled_dot_product_attention = quantized_attention
    _installed.append(original)
