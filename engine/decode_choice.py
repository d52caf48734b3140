"""Whether our CUDA decode kernels run, chosen by measurement per device and model shape.

`engine.cuda_qmv` (quantized linears of a few rows) and `engine.cuda_attention`
(one query over an 8-bit cache) exist only on MLX's CUDA backend. When a model
loads there with ``compute.kernels: auto``, `measure` times each against the MLX
call it would replace, on the model's own shapes, and checks that it computes
the same thing:

- linears: one transformer block's quantized linears on one input row, ours
  against `mx.quantized_matmul`, the block repeated `_REPEAT` times so that one
  evaluation holds many products, as a decode step does (112 for a 7-linear block);
- attention: `ATTENTION_KEYS` 8-bit keys and values with the model's KV heads
  and head dim, ours against dequantizing them and MLX's fused attention (the
  engine's path for an 8-bit cache on CUDA without this kernel); ours are two:
  `engine.cuda_attention`'s on the CUDA cores (``attention``) and the tensor-core
  one of `engine.cuda_attention_mma` (``attention_mma``, where the shape fits it);
  where both beat MLX's, the faster runs;
- chunk attention (``attention_chunk``, `engine.cuda_chunk_attention`): `CHUNK_ROWS` queries over
  a bf16 cache, a forward's layers per evaluation, each evaluation at a new key count as in use
  (MLX's cuDNN attention then builds a plan each time), against MLX's attention;
- the 8-bit cache write (``kv_write``, `engine.cuda_kv_write`): a decode step's rows written in place,
  with our attention reading them, queued as decode queues its steps, against MLX's slice updates;
  only where one of our attention kernels runs (the one reader it orders after itself).

A kernel runs when it is at least `MARGIN` faster and its relative error
against a float32 reference is under `MAX_ERROR` (MLX's own 4-bit product
measured 8e-3 there). Timings are cached with the linear mode's
(``CODECTX_HOME/compute/linear-modes.json``), under a hash of our kernels' code
(`cuda_backend.code_version`): changed code is measured and checked again. ``mlx`` keeps MLX's kernels;
``codectx`` uses ours wherever they apply on CUDA. On any other backend there is
nothing to choose. What runs is part of `engine.compute.ComputePath.identity()`,
hence of the checkpoint policy fingerprint.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import mlx.core as mx
import mlx.nn as nn

from engine import cuda_qmv, decode_kernels
from engine.cuda_backend import code_version, cuda_available
from engine.linear_mode import first_block_linears
from engine.linear_mode_cache import LinearModeCache
from engine.timing import best_seconds

logger = logging.getLogger(__name__)

KERNEL_NAMES = ("qmv", "attention", "attention_mma", "attention_chunk", "kv_write")
MARGIN = 0.05
MAX_ERROR = 2e-2
ATTENTION_KEYS = 16384
CHUNK_ROWS = decode_kernels.CHUNK_MAX_ROWS  # the chunk attention is timed at the most queries it takes
CHUNK_CALLS = 64  # a forward's layers: one evaluation at one new key count
_REPEAT = 16  # block repetitions per timed evaluation of the linears

Timings = dict[str, tuple[float, float]]
"""Kernel -> (MLX seconds, ours seconds); absent: it could not run on this model."""


@dataclass(frozen=True)
class DecodeKernels:
    """Which of our decode kernels a compute path runs.

    Attributes:
        qmv: `engine.cuda_qmv` for quantized linears of at most `cuda_qmv.MAX_ROWS` rows.
        attention: `engine.cuda_attention` for one query over an 8-bit cache.
        source: "measured", "cached", "setting", "not CUDA" or "fallback".
        timings: What the choice was made from.
        notes: Why a kernel was not chosen.
        attention_mma: `engine.cuda_attention_mma` (tensor cores) for that attention instead.
        attention_chunk: `engine.cuda_chunk_attention` for forwards of 2..`decode_kernels.CHUNK_MAX_ROWS`
            tokens over a bf16 cache.
        kv_write: `engine.cuda_kv_write` for a one-token forward's 8-bit cache writes (only with our
            attention: the one reader it orders after itself).
    """

    qmv: bool = False
    attention: bool = False
    source: str = "not CUDA"
    timings: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    attention_mma: bool = False
    attention_chunk: bool = False
    kv_write: bool = False

    @property
    def any(self) -> bool:
        """Whether any of our kernels runs."""
        return any(getattr(self, name) for name in KERNEL_NAMES)

    def identity(self) -> str:
        """The part of `ComputePath.identity()` naming our kernels ("" when none runs)."""
        on = [name for name in KERNEL_NAMES if getattr(self, name)]
        return f"kernels={'+'.join(on)}" if on else ""

    def scope(self, rows: int) -> contextlib.AbstractContextManager[None]:
        """The context a forward over `rows` rows runs in."""
        qmv = self.qmv and rows <= cuda_qmv.MAX_ROWS
        attention = (self.attention or self.attention_mma) and rows == 1
        chunk = self.attention_chunk and 1 < rows <= decode_kernels.CHUNK_MAX_ROWS
        kv_write = self.kv_write and attention  # its one reader in the step is our attention
        return decode_kernels.scope(qmv, attention, self.attention_mma, chunk, kv_write) \
            if qmv or attention or chunk else contextlib.nullcontext()

    def describe(self) -> dict[str, Any]:
        """For `ComputePath.describe()` (status, doctor, `Engine.stats()`)."""
        return {**{name: getattr(self, name) for name in KERNEL_NAMES}, "source": self.source,
                "timings_ms": {k: [round(a * 1e3, 3), round(b * 1e3, 3)] for k, (a, b) in sorted(self.timings.items())},
                "notes": list(self.notes)}


def decide(timings: Mapping[str, tuple[float, float]], margin: float = MARGIN) -> dict[str, bool]:
    """Ours where measured at least `margin` faster than MLX's."""
    return {name: name in timings and timings[name][1] < timings[name][0] * (1.0 - margin) for name in KERNEL_NAMES}


def resolve(model: Any, setting: str = "auto", *, measure: Callable[[Any], Timings] | None = None,
            cache: LinearModeCache | None = None, cuda: bool | None = None) -> DecodeKernels:
    """Our decode kernels for `model` under the ``compute.kernels`` `setting`.

    Args:
        setting: "auto" (measured, cached), "mlx" or "codectx".
        measure: The timing function (tests inject timings here; default `measure`).
        cache: Where timings are kept (default: the linear mode's file under CODECTX_HOME).
        cuda: Whether MLX runs on CUDA (default: `cuda_available()`).
    """
    if setting == "mlx":
        return DecodeKernels(source="setting")
    if not (cuda_available() if cuda is None else cuda):
        notes = ("kernels: ours need MLX's CUDA backend",) if setting == "codectx" else ()
        return DecodeKernels(notes=notes)
    if setting == "codectx":  # ours wherever they apply; the in-place write only where our attention reads it
        ours = _our_attention_takes(model)
        return DecodeKernels(True, True, "setting", attention_chunk=True, kv_write=ours,
                             notes=() if ours else ("kernels: kv_write needs our attention, which does not take "
                                                    "this model's heads",))
    linears = first_block_linears(model)
    cache = cache if cache is not None else LinearModeCache()
    key = cache.key(linears, {"kernels": KERNEL_NAMES, "keys": ATTENTION_KEYS, "repeat": _REPEAT,
                              "attention": _attention_shape(model), "chunk": [CHUNK_ROWS, CHUNK_CALLS],
                              "code": code_version()})
    timings, source = cache.get(key, parse=str), "cached"
    if timings is None:
        try:
            timings, source = (measure or _measure)(model), "measured"
        except Exception as err:  # noqa: BLE001 - the kernels are an optimization: keep MLX's
            logger.warning("decode kernels: measuring failed (%s); using MLX's", err)
            return DecodeKernels(source="fallback", notes=(f"kernels: measuring failed: {err}",))
        cache.put(key, timings)
    chosen, notes = choose_kernels(timings)
    logger.info("decode kernels: %s (%s)", chosen, source)
    return DecodeKernels(source=source, timings=dict(timings), notes=notes, **chosen)


def choose_kernels(timings: Mapping[str, tuple[float, float]]) -> tuple[dict[str, bool], tuple[str, ...]]:
    """What runs (`decide`, and of two attention kernels that win, the faster) and why the others do not."""
    chosen = decide(timings)
    notes = [f"kernels: {name} {'not measured here' if name not in timings else 'slower than MLX'}"
             for name in KERNEL_NAMES if not chosen[name]]
    if chosen["attention"] and chosen["attention_mma"]:  # two kernels for one call
        faster = _faster_attention(timings)
        slower = "attention" if faster == "attention_mma" else "attention_mma"
        chosen[slower] = False
        notes.append(f"kernels: {slower} slower than {faster}")
    if chosen["kv_write"] and not (chosen["attention"] or chosen["attention_mma"]):
        chosen["kv_write"] = False
        notes.append("kernels: kv_write needs our attention")
    return chosen, tuple(notes)


def _faster_attention(timings: Mapping[str, tuple[float, float]]) -> str | None:
    """Of our two attention kernels measured (``attention``, ``attention_mma``), the faster (the tensor-core
    one on a tie); None: neither."""
    measured = [name for name in ("attention_mma", "attention") if name in timings]
    return min(measured, key=lambda name: timings[name][1]) if measured else None


def _our_attention_takes(model: Any) -> bool:
    """Whether one of our decode attention kernels takes `model`'s heads over an 8-bit cache (the one reader
    an in-place cache write is ordered before: elsewhere each layer would evaluate the write first)."""
    from engine import cuda_attention

    shape = _attention_shape(model)
    return shape is not None and any(cuda_attention.shape_problem(*shape, 8, 64, kernel) is None
                                     for kernel in ("cores", "mma"))


def _attention_shape(model: Any) -> tuple[int, int, int] | None:
    """(query heads, KV heads, head dim) of the model's first attention module, or None."""
    for module in model.modules() if isinstance(model, nn.Module) else []:
        heads, kv_heads = getattr(module, "n_heads", None), getattr(module, "n_kv_heads", None)
        if heads and kv_heads and "q_proj" in module:
            return heads, kv_heads, getattr(module, "head_dim", None) or module.q_proj.weight.shape[0] // heads
    return None


def _measure(model: Any) -> Timings:
    """Time and check both kernels on `model`'s shapes (see the module docstring)."""
    timings: Timings = {}
    linears = first_block_linears(model)
    dtype = linears[0]["scales"].dtype if linears else mx.float32
    if linears and all(cuda_qmv.unsupported(m, dtype) is None for m in linears):
        timings["qmv"] = _time_linears(linears, dtype)
    shape = _attention_shape(model)
    if shape is not None:
        from engine import cuda_attention

        heads, kv_heads, dim = shape
        kernels = [k for k in ("cores", "mma") if cuda_attention.shape_problem(heads, kv_heads, dim, 8, 64, k) is None]
        if kernels:
            timings.update(_time_attention(heads, kv_heads, dim, dtype, kernels))
        timings.update(_time_chunk_attention(heads, kv_heads, dim, dtype))
        faster = _faster_attention(timings)
        if faster is not None:  # with the attention kernel that would run beside it
            timings.update(_time_kv_write(heads, kv_heads, dim, dtype, "mma" if faster == "attention_mma" else "cores"))
    return timings


def _check(name: str, ours: mx.array, ref: mx.array) -> None:
    ours, ref = ours.astype(mx.float32), ref.astype(mx.float32)
    err = float(mx.linalg.norm((ours - ref).flatten()) / mx.maximum(mx.linalg.norm(ref.flatten()), 1e-30))
    if not err < MAX_ERROR:
        raise RuntimeError(f"our {name} kernel disagrees with MLX's (relative error {err:.2e})")


def _time_linears(linears: list[nn.QuantizedLinear], dtype: mx.Dtype) -> tuple[float, float]:
    xs = [mx.random.normal((1, m.weight.shape[1] * 32 // m.bits), key=mx.random.key(i)).astype(dtype)
          for i, m in enumerate(linears)]
    for m, x in zip(linears, xs):
        weight = mx.dequantize(m["weight"], m["scales"], m["biases"], m.group_size, m.bits, dtype=mx.float32)
        _check("qmv", cuda_qmv.linear_product(m, x), x.astype(mx.float32) @ weight.T)
    pairs = list(zip(linears, xs)) * _REPEAT
    return (best_seconds(lambda: [nn.QuantizedLinear.__call__(m, x) for m, x in pairs]),
            best_seconds(lambda: [cuda_qmv.linear_product(m, x) for m, x in pairs]))


def _time_attention(heads: int, kv_heads: int, dim: int, dtype: mx.Dtype, kernels: list[str]) -> Timings:
    """"attention" for the CUDA-core kernel (it must compute the same), "attention_mma" for the
    tensor-core one where it does (a failed check leaves it out)."""
    from engine import cuda_attention

    n, scale = ATTENTION_KEYS, dim ** -0.5
    kv = [mx.random.normal((1, kv_heads, n + 256, dim), key=mx.random.key(7 + i)).astype(dtype) for i in range(2)]
    keys, values = (tuple(mx.quantize(a, group_size=64, bits=8)) for a in kv)
    queries = mx.random.normal((1, heads, 1, dim), key=mx.random.key(9)).astype(dtype)
    mx.eval(keys, values, queries)
    reference = cuda_attention.reference(queries.astype(mx.float32), keys, values, n, scale, 64)

    def once(kernel: str) -> mx.array:
        return cuda_attention.decode_attention(queries, keys, values, n, scale, 64, kernel)

    def ours(kernel: str) -> Callable[[], list[mx.array]]:
        return lambda: [once(kernel) for _ in range(_REPEAT)]

    if "cores" in kernels:
        _check("attention", once("cores"), reference)
    mlx_seconds = best_seconds(lambda: [cuda_attention.reference(queries, keys, values, n, scale, 64)
                                        for _ in range(_REPEAT)])
    timings = {"attention": (mlx_seconds, best_seconds(ours("cores")))} if "cores" in kernels else {}
    if "mma" in kernels:
        try:  # the newer kernel: left out, not fatal, where it fails its check (or to compile)
            _check("attention_mma", once("mma"), reference)
            timings["attention_mma"] = (mlx_seconds, best_seconds(ours("mma")))
        except Exception as err:  # noqa: BLE001
            logger.warning("decode kernels: %s; not using it", err)
    return timings


def _time_chunk_attention(heads: int, kv_heads: int, dim: int, dtype: mx.Dtype) -> Timings:
    """"attention_chunk": `CHUNK_ROWS` queries over a bf16 cache, a forward's `CHUNK_CALLS` layers per
    evaluation, each evaluation at a key count not seen before (as every chunk of a growing prompt
    is: MLX's cuDNN attention then builds a plan). Left out where the shape is not the kernel's or
    it fails its check (or to compile)."""
    from engine import cuda_chunk_attention as chunk

    if chunk.shape_problem(CHUNK_ROWS, heads // kv_heads, dim, dtype) is not None:
        return {}
    scale = dim ** -0.5
    kv = [mx.random.normal((1, kv_heads, ATTENTION_KEYS + 512, dim), key=mx.random.key(3 + i)).astype(dtype)
          for i in range(2)]
    queries = mx.random.normal((1, heads, CHUNK_ROWS, dim), key=mx.random.key(5)).astype(dtype)
    mx.eval(kv, queries)
    counts = iter(range(ATTENTION_KEYS, ATTENTION_KEYS + 512))

    def mlx() -> list[mx.array]:
        n = next(counts)
        return [mx.fast.scaled_dot_product_attention(queries, kv[0][..., :n, :], kv[1][..., :n, :], scale=scale,
                                                     mask="causal") for _ in range(CHUNK_CALLS)]

    def ours() -> list[mx.array]:
        n = next(counts)
        return [chunk.chunk_attention(queries, kv[0], kv[1], n, scale) for _ in range(CHUNK_CALLS)]

    try:
        _check("attention_chunk", chunk.chunk_attention(queries, kv[0], kv[1], ATTENTION_KEYS, scale),
               chunk.reference(queries, kv[0], kv[1], ATTENTION_KEYS, scale))
        return {"attention_chunk": (best_seconds(mlx) / CHUNK_CALLS, best_seconds(ours) / CHUNK_CALLS)}
    except Exception as err:  # noqa: BLE001 - the newest kernel: left out, not fatal
        logger.warning("decode kernels: %s; not using the chunk attention", err)
        return {}


def _time_kv_write(heads: int, kv_heads: int, dim: int, dtype: mx.Dtype, kernel: str, steps: int = 8,
                   layers: int = 16) -> Timings:
    """"kv_write": a decode step's 8-bit cache write and attention (our `kernel`) in `layers` layers of
    about `ATTENTION_KEYS` rows, `steps` steps queued as the engine queues them (step n + 1 before step
    n is read), the write by MLX's slice updates against ours in place (a slice update copies a buffer
    that a queued step still holds). Checked first (`_check_kv_write`). Left out where it fails (or
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
        _check_kv_write(query, kv_heads, fill, rows[1], kernel)
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
    mx.eval([store.keys for store in made])
    return made


def _attend_rows(store: Any, query: mx.array, n: int, kernel: str) -> mx.array:
    """Our decode attention over the store's first `n` rows, after the store's last in-place write."""
    from engine import cuda_attention

    keys, values = store.rows(n)
    return cuda_attention.decode_attention(query, keys, values, n, query.shape[-1] ** -0.5, store.group_size,
                                           kernel, after=keys.after)


def _check_kv_write(query: mx.array, kv_heads: int, fill: mx.array, value: mx.array, kernel: str) -> None:
    """A row written in place after `fill`, and our attention over it, evaluated together as in a decode
    step: the row against `mx.quantize` (`_check_quantized_row`), the attention against MLX's. The new key
    is the query's direction, three times over: the attention is nearly its value alone, so an attention
    that ran before the write (the old row: an ordering edge missing) could not pass."""
    from engine import cuda_attention

    at, heads = fill.shape[2], query.shape[1]
    store, key = _filled_stores(fill, 1)[0], 3 * query[:, ::heads // kv_heads]
    store.write(at, key, value, in_place=True)
    ours = _attend_rows(store, query, at + 1, kernel)
    mx.eval(ours)  # one evaluation holding the write and the attention: only `after` orders them
    for written, row in zip(store.read(at, at + 1), (key, value)):
        _check_quantized_row(written, row, store.group_size)
    _check("kv_write", ours, cuda_attention.reference(query.astype(mx.float32), store.keys, store.values, at + 1,
                                                       query.shape[-1] ** -0.5, store.group_size))


def _check_quantized_row(ours: mx.array, row: mx.array, group_size: int) -> None:
    """A row as an 8-bit store holds it (dequantized) against `mx.quantize(row)`: each value within one
    quantization step of its group."""
    theirs_q = mx.quantize(row, group_size=group_size, bits=8)
    theirs = mx.dequantize(*theirs_q, group_size=group_size, bits=8)
    step = mx.repeat(mx.abs(theirs_q[1]).astype(mx.float32), group_size, axis=-1)
    diff = mx.abs(ours.astype(mx.float32) - theirs.astype(mx.float32))
    if not mx.all(diff <= step * 1.01 + 1e-6).item():
        raise RuntimeError(f"our in-place 8-bit cache write differs from mx.quantize by up to "
                           f"{float(mx.max(diff).item()):.3g}, more than a quantization step")
