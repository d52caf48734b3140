"""The load-time measurements behind `engine.decode_choice`: each of our decode kernels timed against the
MLX call it would replace, on the model's own shapes, and checked first: against a float32 reference (the
linears, the attentions), `mx.quantize` (the cache write), or the model's own calls (the fused launches:
the MLP's own call, the attention module's own norms and RoPE). Only on MLX's CUDA backend; see
`engine.decode_choice` for what is measured and how the results decide.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu

from engine import compiled_mlp, cpu_attention, cuda_qk_rope, cuda_qmv, decode_kernels, fused_linears, linear_mode
from engine.linear_mode import first_block_linears
from engine.timing import best_seconds

logger = logging.getLogger(__name__)

MAX_ERROR = 2e-2
ATTENTION_KEYS = 16384
ATTENTION_CACHES = 4  # 8-bit caches of ATTENTION_KEYS rows the attention timing takes in turn (past a 50 MB L2)
REPEAT = 16  # block repetitions per timed evaluation of the linears
ROPE_POSITION = 100_003  # where the fused RoPE is checked: far into a long context, where angles are large

Timings = dict[str, tuple[float, float]]
"""Kernel -> (MLX seconds, ours seconds); absent: it could not run on this model."""


ATTENTION_TIMINGS = {"attention_transposed": "transposed", "attention_staged": "staged", "attention_mma": "mma",
                     "attention": "cores"}
"""Our one-query attention kernels: the name of each one's timing (and `engine.decode_choice`'s switch) ->
`engine.cuda_attention.decode_attention`'s name for it, in the order they ranked over 131,072 keys (H100, run l:
114, 120 and 144 µs a call for the first three; docs/benchmarks.md, *GPU engine*): on a near tie the earlier wins."""
ATTENTION_NEAR = 0.05
"""How close to the fastest an earlier attention kernel wins: they are timed over `ATTENTION_KEYS` keys, where
they rank otherwise than at long contexts. At 16,384 keys the three tensor-core kernels came within 1% (run u,
H200) and noise picked mma, the slowest of them over 131,072 keys on the H100 (run l)."""


MARGIN = 0.05
"""How much faster than MLX's call one of our kernels must measure to run (`engine.decode_choice.decide`)."""


def faster_attention(timings: Mapping[str, tuple[float, float]]) -> str | None:
    """Of our attention kernels measured (`ATTENTION_TIMINGS`) that beat MLX's by `MARGIN`, the earliest within
    `ATTENTION_NEAR` of the fastest: the one that runs (`engine.decode_choice`), and beside which the cache write
    is timed; None: none."""
    measured = [name for name in ATTENTION_TIMINGS
                if name in timings and timings[name][1] < timings[name][0] * (1.0 - MARGIN)]
    if not measured:
        return None
    best = min(timings[name][1] for name in measured)
    return next(name for name in measured if timings[name][1] <= best * (1 + ATTENTION_NEAR))


def attention_shape(model: Any) -> tuple[int, int, int] | None:
    """(query heads, KV heads, head dim) of the model's first attention module, or None."""
    for module in model.modules() if isinstance(model, nn.Module) else []:
        heads, kv_heads = getattr(module, "n_heads", None), getattr(module, "n_kv_heads", None)
        if heads and kv_heads and "q_proj" in module:
            return heads, kv_heads, getattr(module, "head_dim", None) or module.q_proj.weight.shape[0] // heads
    return None


def attention_kernels(shape: tuple[int, int, int]) -> list[str]:
    """Which of our decode attention kernels ("cores", "mma", "staged", "transposed") take one query of (query heads, KV
    heads, head dim) over the engine's 8-bit cache (groups of 64)."""
    from engine import cuda_attention

    return [kernel for kernel in ATTENTION_TIMINGS.values()
            if cuda_attention.shape_problem(*shape, 8, 64, kernel) is None]


def compute_dtype(model: Any) -> mx.Dtype:
    """The dtype the model computes in: its first block's quantized linears' scales' (float32 without any)."""
    linears = first_block_linears(model)
    return linears[0]["scales"].dtype if linears else mx.float32


def measure(model: Any) -> Timings:
    """Time and check our kernels on `model`'s shapes (see the module docstring)."""
    timings: Timings = {}
    linears = first_block_linears(model)
    dtype = compute_dtype(model)
    if linears and all(cuda_qmv.unsupported(m, dtype) is None for m in linears):
        head = getattr(model, "lm_head", None)
        own_head = [head] if isinstance(head, nn.QuantizedLinear) and cuda_qmv.unsupported(head, dtype) is None else []
        timings["qmv"] = _time_linears(linears, dtype, own_head)
        timings.update(_time_split(linears, dtype))
        timings.update(_time_compiled_mlp(model, dtype))
        timings.update(_time_fused(model, dtype))
    shape = attention_shape(model)
    if shape is not None:
        heads, kv_heads, dim = shape
        kernels = attention_kernels(shape)
        if kernels:
            timings.update(_time_attention(heads, kv_heads, dim, dtype, kernels))
        if cpu_attention.wirable(model):  # the wired call is where this kernel runs (`engine.compute`)
            timings.update(_time_rope(model, dtype))
        faster = faster_attention(timings)
        if faster is not None:  # with the attention kernel that would run beside it
            timings.update(time_kv_write(heads, kv_heads, dim, dtype, ATTENTION_TIMINGS[faster]))
    return timings


def check_close(name: str, ours: mx.array, ref: mx.array, what: str = "kernel") -> None:
    """Raises RuntimeError unless `ours` is within `MAX_ERROR` of `ref` (relative, over the whole array)."""
    ours, ref = ours.astype(mx.float32), ref.astype(mx.float32)
    err = float(mx.linalg.norm((ours - ref).flatten()) / mx.maximum(mx.linalg.norm(ref.flatten()), 1e-30))
    if not err < MAX_ERROR:
        raise RuntimeError(f"our {name} {what} disagrees with MLX's (relative error {err:.2e})")


def _time_linears(linears: list[nn.QuantizedLinear], dtype: mx.Dtype,
                  checked: Sequence[nn.QuantizedLinear] = ()) -> tuple[float, float]:
    """The block's `linears` timed, ours against MLX's, after each of them and of `checked` (the model's own
    head, which our kernel multiplies too: `linear_mode.wire_head`) was held to a float32 product."""
    xs = _held_to_float32("qmv", [*linears, *checked], dtype, cuda_qmv.linear_product)
    pairs = list(zip(linears, xs)) * REPEAT
    return (best_seconds(lambda: [nn.QuantizedLinear.__call__(m, x) for m, x in pairs]),
            best_seconds(lambda: [cuda_qmv.linear_product(m, x) for m, x in pairs]))


def _held_to_float32(name: str, linears: Sequence[nn.QuantizedLinear], dtype: mx.Dtype,
                     product: Callable[[nn.QuantizedLinear, mx.array], mx.array], seed: int = 0) -> list[mx.array]:
    """A random input row for each of `linears` (keys from `seed`), after `product` of each was held to a float32
    product of its dequantized weight (`check_close`); the rows."""
    xs = [mx.random.normal((1, m.weight.shape[1] * 32 // m.bits), key=mx.random.key(seed + i)).astype(dtype)
          for i, m in enumerate(linears)]
    for m, x in zip(linears, xs):
        weight = mx.dequantize(m["weight"], m["scales"], m["biases"], m.group_size, m.bits, dtype=mx.float32)
        check_close(name, product(m, x), x.astype(mx.float32) @ weight.T)
    return xs


def _time_split(linears: list[nn.QuantizedLinear], dtype: mx.Dtype) -> Timings:
    """"qmv_split": the block's linears that `engine.cuda_qmv_split` splits (few, long rows: a down or o
    projection) on one row, `REPEAT` times per evaluation, split against `engine.cuda_qmv` unsplit, after each
    was held to a float32 product. Left out where none splits or it fails its check (or to compile)."""
    from engine import cuda_qmv_split

    split = [m for m in linears if cuda_qmv_split.linear_split(m) > 1]
    try:
        xs = _held_to_float32("qmv_split", split, dtype, cuda_qmv_split.linear_product, seed=60)
    except Exception as err:  # noqa: BLE001 - a variant of our linears: left out, not fatal
        logger.warning("decode kernels: %s; not splitting our linears", err)
        return {}
    pairs = list(zip(split, xs)) * REPEAT
    return {"qmv_split": (best_seconds(lambda: [cuda_qmv.linear_product(m, x) for m, x in pairs]),
                          best_seconds(lambda: [cuda_qmv_split.linear_product(m, x) for m, x in pairs]))} \
        if split else {}


def _time_compiled_mlp(model: Any, dtype: mx.Dtype) -> Timings:
    """"mlp_compiled": the first block's MLP on one row with our linears, `REPEAT` calls per evaluation,
    its trace against its own call (checked first, within `MAX_ERROR`; the cost of making the trace is not
    timed: the engine pays it once per block, at its first decode step). Left out where it fails (or cannot
    be traced)."""
    mlp = compiled_mlp.first_mlp(model)
    width = getattr(getattr(model, "args", None), "hidden_size", None)
    if mlp is None or width is None:
        return {}
    x = mx.random.normal((1, 1, width), key=mx.random.key(50)).astype(dtype)
    traced = mx.compile(lambda v: mlp(v))
    # The linears' class that takes our kernel, for this measurement only (the compute path wires it for qmv).
    linears = [m for m in mlp.modules() if isinstance(m, nn.QuantizedLinear)]
    try:
        with linear_mode.wired(linears), decode_kernels.scope(qmv=True, attention=False):
            check_close("mlp_compiled", traced(x), mlp(x))
            return {"mlp_compiled": (best_seconds(lambda: [mlp(x) for _ in range(REPEAT)]),
                                     best_seconds(lambda: [traced(x) for _ in range(REPEAT)]))}
    except Exception as err:  # noqa: BLE001 - an optimization: left out, not fatal
        logger.warning("decode kernels: compiled MLP: %s; not using it", err)
        return {}


def _time_fused(model: Any, dtype: mx.Dtype) -> Timings:
    """"qmv_fused": the first block's q, k and v projections and its MLP's ``silu(gate x) * up x`` on one row,
    `REPEAT` times per evaluation: our kernel once per linear and mlx-lm's activation against one launch each
    (`engine.fused_linears`), checked first: each projection against our kernel's, the fused MLP against the
    MLP's own call. Left out where the block's linears (or its MLP's class: `fused_linears.SWIGLU`) are not the
    fused kernels' or they fail (or fail to compile)."""
    attention = _first_attention(model)
    mlp = compiled_mlp.first_mlp(model)
    if attention is None or mlp is None or not fused_linears.swiglu(mlp):
        return {}
    qkv, gate_up = (attention.q_proj, attention.k_proj, attention.v_proj), (mlp.gate_proj, mlp.up_proj)
    if not (cuda_qmv.fusable(qkv, dtype) and cuda_qmv.fusable(gate_up, dtype)):
        return {}
    x = mx.random.normal((1, 1, qkv[0]["weight"].shape[-1] * 32 // qkv[0].bits), key=mx.random.key(60)).astype(dtype)

    def separate() -> list[mx.array]:  # (the activation as mlx-lm's MLPs compute it: one compiled launch)
        gate, up = (cuda_qmv.linear_product(m, x) for m in gate_up)
        return [*(cuda_qmv.linear_product(m, x) for m in qkv), swiglu(gate, up)]

    def fused() -> list[mx.array]:
        return [*cuda_qmv.three(x, qkv), cuda_qmv.glu(x, *gate_up)]

    try:  # each product against our kernel's; the fused MLP against the MLP's own call (its activation)
        for ours, theirs in zip([*cuda_qmv.three(x, qkv), mlp.down_proj(cuda_qmv.glu(x, *gate_up))],
                                [*separate()[:3], mlp(x)]):
            check_close("qmv_fused", ours, theirs)
        return {"qmv_fused": (best_seconds(lambda: [separate() for _ in range(REPEAT)]),
                              best_seconds(lambda: [fused() for _ in range(REPEAT)]))}
    except Exception as err:  # noqa: BLE001 - the newest kernels: left out, not fatal
        logger.warning("decode kernels: fused linears: %s; not using them", err)
        return {}


def _time_rope(model: Any, dtype: mx.Dtype) -> Timings:
    """"rope_fused": the first block's per-head norms and RoPE of one token (random queries and keys) at
    `ROPE_POSITION`, `REPEAT` times per evaluation: the module's own operations against one launch
    (`engine.cuda_qk_rope`), checked first against them. Left out where the kernel does not serve the module
    or fails its check (or to compile)."""
    attention = _first_attention(model)
    if attention is None or not cuda_qk_rope.takes(attention, dtype):
        return {}
    q, k = (mx.random.normal((1, 1, m.weight.shape[0]), key=mx.random.key(61 + i)).astype(dtype)
            for i, m in enumerate((attention.q_proj, attention.k_proj)))
    own = lambda: fused_linears.own_rotation(attention, q, k, ROPE_POSITION)  # noqa: E731
    fused = lambda: cuda_qk_rope.qk_rope(attention, q, k, ROPE_POSITION)  # noqa: E731
    try:
        for ours, theirs in zip(fused(), own()):
            check_close("rope_fused", ours, theirs)
        return {"rope_fused": (best_seconds(lambda: [own() for _ in range(REPEAT)]),
                               best_seconds(lambda: [fused() for _ in range(REPEAT)]))}
    except Exception as err:  # noqa: BLE001 - the newest kernel: left out, not fatal
        logger.warning("decode kernels: fused norms and RoPE: %s; not using them", err)
        return {}


def _first_attention(model: Any) -> Any | None:
    return next((m for m in model.modules() if all(name in m for name in ("q_proj", "k_proj", "v_proj"))), None)


def _time_attention(heads: int, kv_heads: int, dim: int, dtype: mx.Dtype, kernels: list[str]) -> Timings:
    """"attention" for the CUDA-core kernel (it must compute the same), "attention_mma", "attention_staged" and
    "attention_transposed" for the tensor-core ones where they do (a failed check leaves one out)."""
    from engine import cuda_attention

    n, scale = ATTENTION_KEYS, dim ** -0.5
    caches = []  # several, taken in turn: a decode step's layers read their caches from memory, not from L2
    for c in range(ATTENTION_CACHES):
        kv = [mx.random.normal((1, kv_heads, n + 256, dim), key=mx.random.key(7 + 2 * c + i)).astype(dtype)
              for i in range(2)]
        caches.append(tuple(tuple(mx.quantize(a, group_size=64, bits=8)) for a in kv))
    keys, values = caches[0]
    queries = mx.random.normal((1, heads, 1, dim), key=mx.random.key(9)).astype(dtype)
    mx.eval(caches, queries)
    checked = n - 5  # a last tile part full, and (as a traced step's array count) splits past the count
    reference = cuda_attention.reference(queries.astype(mx.float32), keys, values, checked, scale, 64)

    def once(kernel: str, cache: int = 0) -> mx.array:
        return cuda_attention.decode_attention(queries, *caches[cache], n, scale, 64, kernel)

    def check(name: str, kernel: str) -> None:
        for count in (checked, mx.array([checked], dtype=mx.int32)):
            check_close(name, cuda_attention.decode_attention(queries, keys, values, count, scale, 64, kernel),
                        reference)

    def ours(kernel: str) -> Callable[[], list[mx.array]]:
        return lambda: [once(kernel, i % ATTENTION_CACHES) for i in range(REPEAT)]

    if "cores" in kernels:
        check("attention", "cores")
    mlx_seconds = best_seconds(lambda: [cuda_attention.reference(queries, *caches[i % ATTENTION_CACHES], n, scale, 64)
                                        for i in range(REPEAT)])
    timings = {"attention": (mlx_seconds, best_seconds(ours("cores")))} if "cores" in kernels else {}
    for name, kernel in ATTENTION_TIMINGS.items():
        if kernel == "cores" or kernel not in kernels:
            continue
        try:  # the newer kernels: left out, not fatal, where one fails its check (or to compile)
            check(name, kernel)
            timings[name] = (mlx_seconds, best_seconds(ours(kernel)))
        except Exception as err:  # noqa: BLE001
            logger.warning("decode kernels: %s; not using it", err)
    return timings


def time_kv_write(heads: int, kv_heads: int, dim: int, dtype: mx.Dtype, kernel: str, steps: int = 8,
                   layers: int = 16) -> Timings:
    """"kv_write": a decode step's 8-bit cache write and attention (our `kernel`) in `layers` layers of
    about `ATTENTION_KEYS` rows, `steps` steps queued as the engine queues them (step n + 1 before step
    n is read), the write by MLX's slice updates against ours in place (a slice update copies a buffer
    that a queued step still holds). Checked first (`check_kv_write`). Left out where it fails (or
    fails to compile)."""
    from engine import cuda_kv_write

    rows = [mx.random.normal((1, kv_heads, 1, dim), key=mx.random.key(20 + i)).astype(dtype) for i in range(steps)]
    per_kv_head = mx.random.normal((1, kv_heads, 1, dim), key=mx.random.key(29)).astype(dtype)
    query = mx.repeat(per_kv_head, heads // kv_heads, axis=1)  # the query heads of a KV head alike
    # The rows before the written ones end inside the buffer's last 256-row block, with room for the steps
    # (the writes are ours, not a regrowth).
    fill = mx.random.normal((1, kv_heads, ATTENTION_KEYS - 256 - 2 * steps, dim), key=mx.random.key(30)).astype(dtype)
    if cuda_kv_write.shape_problem(rows[0], 8) is not None:
        return {}
    at = fill.shape[2]

    def timed(in_place: bool) -> Callable[[], list[mx.array]]:
        made = _filled_stores(fill, layers)

        def queued_steps() -> list[mx.array]:
            outs: list[mx.array] = []
            for i, row in enumerate(rows):
                step = []
                for store in made:
                    store.write(at + i, row, row, in_place=in_place)
                    step.append(_attend_rows(store, query, at + i + 1, kernel))
                mx.async_eval(step)
                outs += step
            return outs
        return queued_steps

    try:
        check_kv_write(query, kv_heads, fill, rows[1], kernel)
        return {"kv_write": (best_seconds(timed(False)) / steps, best_seconds(timed(True)) / steps)}
    except Exception as err:  # noqa: BLE001 - the newest kernel: left out, not fatal
        logger.warning("decode kernels: %s; not using the in-place cache write", err)
        return {}


def _filled_stores(fill: mx.array, count: int) -> list[Any]:
    """`count` 8-bit stores holding `fill`, written by a slice update (so the buffers are the store's alone)."""
    from engine.qkv import QuantizedKVStore

    made = [QuantizedKVStore() for _ in range(count)]
    for store in made:
        store.write(0, fill, fill)
    mx.eval([(store.keys, store.values) for store in made])
    return made


def _attend_rows(store: Any, query: mx.array, n: int, kernel: str) -> mx.array:
    """Our decode attention over the store's first `n` rows, after the store's last in-place write."""
    from engine import cuda_attention

    keys, values = store.rows(n)
    return cuda_attention.decode_attention(query, keys, values, n, query.shape[-1] ** -0.5, store.group_size,
                                           kernel, after=keys.after)


def check_kv_write(query: mx.array, kv_heads: int, fill: mx.array, value: mx.array, kernel: str) -> None:
    """A row written in place after `fill`, and our attention over it, evaluated together as in a decode
    step: the row against `mx.quantize` (`check_quantized_row`), the attention against MLX's. The new key
    is the query's direction, three times over: the attention is nearly its value alone, so an attention
    that ran before the write (the old row: an ordering edge missing) could not pass."""
    from engine import cuda_attention

    at, heads = fill.shape[2], query.shape[1]
    store, key = _filled_stores(fill, 1)[0], 3 * query[:, ::heads // kv_heads]
    store.write(at, key, value, in_place=True)
    ours = _attend_rows(store, query, at + 1, kernel)
    mx.eval(ours)  # one evaluation holding the write and the attention: only `after` orders them
    for written, row in zip(store.read(at, at + 1), (key, value)):
        check_quantized_row(written, row, store.group_size)
    check_close("kv_write", ours, cuda_attention.reference(query.astype(mx.float32), store.keys, store.values, at + 1,
                                                       query.shape[-1] ** -0.5, store.group_size))


def check_quantized_row(ours: mx.array, row: mx.array, group_size: int) -> None:
    """A row as an 8-bit store holds it (dequantized) against `mx.quantize(row)`: each value within one
    quantization step of its group."""
    theirs_q = mx.quantize(row, group_size=group_size, bits=8)
    theirs = mx.dequantize(*theirs_q, group_size=group_size, bits=8)
    step = mx.repeat(mx.abs(theirs_q[1]).astype(mx.float32), group_size, axis=-1)
    diff = mx.abs(ours.astype(mx.float32) - theirs.astype(mx.float32))
    if not mx.all(diff <= step * 1.01 + 1e-6).item():
        raise RuntimeError(f"our in-place 8-bit cache write differs from mx.quantize by up to "
                           f"{float(mx.max(diff).item()):.3g}, more than a quantization step")
