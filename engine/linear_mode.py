"""The linear mode: how quantized linear layers multiply prefill-sized inputs, chosen by measurement.

A 4-bit model's linear layers multiply with MLX's `quantized_matmul`, which
reads the packed weights once per call: right for decode (a few rows, bound by
the bytes read), but on a GPU it capped long-context prefill well below the
dense matmul's rate (docs/benchmarks.md, *GPU engine*). The alternative is to
dequantize a layer's weight to the activations' dtype for that one call (on
MLX's CUDA backend by our kernel, `engine.cuda_dequant`, whose output equals
MLX's `dequantize` bit for bit) and use the dense matmul. Which is faster
depends on the device, the shape and the rows per call, so it is measured, not
assumed from the platform's name:

- `measure_layer` times one transformer block's quantized linears on random
  inputs of `LADDER` row counts, both ways;
- `decide` picks the smallest row count from which dequantizing wins at every
  larger rung by at least `MARGIN` ("dequantized", with that `min_rows`), or
  "quantized" when it never does; decode-sized inputs (under `LADDER[0]` rows)
  always keep the quantized kernel;
- `resolve` applies the ``compute.linear`` setting and caches measurements per
  device and model shape in ``CODECTX_HOME/compute/linear-modes.json``
  (`engine.linear_mode_cache`), so a model is measured once per device.

A model without quantized linears (every model on the CPU build, whose weights
are dequantized to float32 at load: `engine.loaded_model.weight_dtype`) resolves
to "unquantized": there is nothing to choose. `LinearMode.identity()` is part
of `engine.compute.ComputePath.identity()` and so of the checkpoint policy
fingerprint: checkpoints computed under one mode are never restored under another.

Memory: the dequantized weight exists only for the call that uses it (one
linear at a time in evaluation order); the largest linear of the Qwen3-32B
shape (25600 x 5120) is 250 MiB in bfloat16; the peak the GPU benchmark
measured is in docs/benchmarks.md.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import mlx.core as mx
import mlx.nn as nn

from engine import cuda_dequant, cuda_qmv, cuda_qmv_split, decode_kernels, fused_residual
from engine.last_row import LastRowQuantizedLinear, last_row
from engine.linear_mode_cache import LinearModeCache, Timings
from engine.switches import Switch
from engine.timing import best_seconds

logger = logging.getLogger(__name__)

LADDER = (32, 64, 128, 256, 512, 1024, 2048)
"""Rows per call that are timed; inputs under the first rung are decode-sized and stay quantized (decode,
speculative verification of up to `engine.compiled.VERIFY_MAX_TOKENS` = 16 rows)."""
MARGIN = 0.05
"""Dequantizing must be at least this much faster (a share of the quantized time) to be chosen."""
REPEATS = 3
PER_EVALUATION = 4
"""The block's products run this many times per timed evaluation (the time divided back), so an evaluation's
fixed cost is a smaller share of the small rungs. (On the H200 at 64 rows one evaluation per product gave
1.98 ms per block both ways, one per block 1.06-1.28 ms; four per evaluation is not measured there yet.)"""

Measure = Callable[[Any], Timings]

_dequantize = Switch("codectx_dequantized_linears")
dequantized_linears = _dequantize.scope
"""Inside this block, wired linears on this thread multiply with dequantized weights."""


class DequantizingLinear(nn.QuantizedLinear):
    """A `QuantizedLinear` that, inside `dequantized_linears()`, dequantizes its weight for the call.

    Assigned to existing modules as their class (`wire`), so parameters, names
    and `isinstance` checks stay as they are; outside the context (decode, a
    compiled step, any caller that did not ask) it is the quantized kernel.
    """

    def __call__(self, x: mx.array) -> mx.array:
        if _dequantize.on():
            return dequantized_product(self, x)
        if decode_sized(self, x):  # (with the block's residual, where it offers this product one)
            kernel = cuda_qmv_split if decode_kernels.qmv_split_on() else cuda_qmv
            return kernel.linear_product(self, x, fused_residual.take(self))
        return super().__call__(x)


class DecodeHeadLinear(LastRowQuantizedLinear):
    """A model's quantized LM head through `engine.cuda_qmv` for decode-sized inputs while `qmv_on()` (assigned
    as its class by `wire_head`); never dequantized; inside `engine.last_row.scope()` on the last row of its
    input only, as every wired head; elsewhere the quantized kernel. On the H200 MLX's kernel read a Qwen3-32B
    head at 1.04 TB/s, 0.42 ms of a 16.7 ms step (docs/benchmarks.md, *GPU engine*, twelfth session)."""

    def __call__(self, x: mx.array) -> mx.array:
        x = last_row(x)
        if decode_sized(self, x):
            return cuda_qmv.linear_product(self, x)
        return nn.QuantizedLinear.__call__(self, x)


def wire_head(model: Any) -> bool:
    """Give `model`'s own quantized LM head (not tied to the embeddings) `DecodeHeadLinear`'s call
    (idempotent); whether it has one."""
    head = getattr(model, "lm_head", None)
    if type(head) in (nn.QuantizedLinear, LastRowQuantizedLinear):
        head.__class__ = DecodeHeadLinear
    return isinstance(head, DecodeHeadLinear)


def decode_sized(linear: nn.QuantizedLinear, x: mx.array) -> bool:
    """Whether `linear(x)` goes through `engine.cuda_qmv` now: its switch on, at most `cuda_qmv.MAX_ROWS`
    rows, a weight the kernel takes."""
    return decode_kernels.qmv_on() and x.size // x.shape[-1] <= cuda_qmv.MAX_ROWS and cuda_qmv.takes(linear, x.dtype)


def dequantized_product(linear: nn.QuantizedLinear, x: mx.array) -> mx.array:
    """`linear(x)` through its weight dequantized to `x`'s dtype and the dense matmul."""
    y = mx.matmul(x, cuda_dequant.weight_of(linear, x.dtype).T)
    return y + linear["bias"] if "bias" in linear else y


def first_block_linears(model: Any) -> list[nn.QuantizedLinear]:
    """The quantized linears of the first transformer block that has any ([] when none has):
    what one block's measurement times (here and in `engine.decode_choice`)."""
    per_block = ([m for m in block.modules() if isinstance(m, nn.QuantizedLinear)]
                 for block in getattr(model, "layers", []))
    return next((found for found in per_block if found), [])


def block_linears(model: Any) -> list[nn.QuantizedLinear]:
    """The quantized linears of `model`'s transformer blocks (embeddings and the head excluded)."""
    blocks = getattr(model, "layers", None)
    if blocks is None:
        return []
    return [m for block in blocks for m in block.modules() if isinstance(m, nn.QuantizedLinear)]


def wire(model: Any) -> int:
    """Give every quantized linear of `model`'s blocks the dequantizing call (idempotent).

    Returns:
        How many linears are wired.
    """
    linears = block_linears(model)
    _wire(linears)
    return sum(isinstance(m, DequantizingLinear) for m in linears)


@contextlib.contextmanager
def wired(linears: list[nn.QuantizedLinear]) -> Iterator[None]:
    """Inside this block, `linears` have the dequantizing call (a measurement's, not the model's: those that
    were plain quantized linears are given their class back after)."""
    plain = _wire(linears)
    try:
        yield
    finally:
        for linear in plain:
            linear.__class__ = nn.QuantizedLinear


def _wire(linears: list[nn.QuantizedLinear]) -> list[nn.QuantizedLinear]:
    """The plain quantized linears among `linears`, given the dequantizing call."""
    plain = [m for m in linears if type(m) is nn.QuantizedLinear]
    for linear in plain:
        linear.__class__ = DequantizingLinear
    return plain


@dataclass(frozen=True)
class LinearMode:
    """The resolved linear mode of one compute path.

    Attributes:
        mode: "quantized" (the quantized kernel for every input), "dequantized"
            (inputs of at least `min_rows` rows multiply with dequantized weights)
            or "unquantized" (the model has no quantized linears).
        min_rows: The first row count that dequantizes (0 unless "dequantized").
        source: "measured", "cached", "setting", "no quantized layers" or "fallback".
        timings: What the decision was made from (rows -> quantized, dequantized seconds).
        measure_s: Seconds measuring took at this load (0 when cached or not measured).
        notes: Why a setting resolved to something else, or why measuring failed.
    """

    mode: str
    min_rows: int = 0
    source: str = "setting"
    timings: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    measure_s: float = 0.0
    notes: tuple[str, ...] = ()

    def identity(self) -> str:
        """What runs, for `ComputePath.identity()` (and so the checkpoint policy)."""
        return f"linear=dequantized>={self.min_rows}" if self.mode == "dequantized" else f"linear={self.mode}"

    def applies(self, rows: int) -> bool:
        """Whether an input of `rows` rows multiplies with dequantized weights."""
        return self.mode == "dequantized" and rows >= self.min_rows

    def scope(self, rows: int) -> contextlib.AbstractContextManager[None]:
        """The context a forward over `rows` rows runs in."""
        return dequantized_linears() if self.applies(rows) else contextlib.nullcontext()

    def describe(self) -> dict[str, Any]:
        """For `ComputePath.describe()` (status, `Engine.stats()`)."""
        return {"mode": self.mode, "min_rows": self.min_rows, "source": self.source,
                "measure_s": round(self.measure_s, 3),
                "timings_ms": {str(rows): [round(q * 1e3, 3), round(d * 1e3, 3)]
                               for rows, (q, d) in sorted(self.timings.items())}}


def decide(timings: Mapping[int, tuple[float, float]], margin: float = MARGIN) -> tuple[str, int]:
    """("dequantized", min_rows) from the smallest rung on which dequantizing wins at every larger one,
    else ("quantized", 0)."""
    min_rows = 0
    for rows in sorted(timings, reverse=True):
        quantized, dequantized = timings[rows]
        if not dequantized < quantized * (1.0 - margin):
            break
        min_rows = rows
    return ("dequantized", min_rows) if min_rows else ("quantized", 0)


def measure_layer(model: Any, ladder: tuple[int, ...] = LADDER, repeats: int = REPEATS) -> Timings:
    """Time one block's quantized linears both ways on random inputs of each `ladder` row count.

    Each timing is the best of `repeats` after one untimed run (kernel compilation), per block.
    """
    linears = first_block_linears(model)
    dtype = linears[0]["scales"].dtype
    inputs = {id(m): m.weight.shape[1] * 32 // m.bits for m in linears}
    timings: Timings = {}
    for rows in ladder:
        xs = [mx.random.normal((rows, inputs[id(m)]), key=mx.random.key(rows)).astype(dtype) for m in linears]
        mx.eval(xs)
        timings[rows] = (_best(linears, xs, nn.QuantizedLinear.__call__, repeats),
                         _best(linears, xs, dequantized_product, repeats))
    return timings


def _best(linears: list[nn.QuantizedLinear], xs: list[mx.array], product: Callable, repeats: int) -> float:
    # The block's products in one evaluation, as a forward runs them (several blocks' worth).
    return best_seconds(lambda: [product(linear, x) for _ in range(PER_EVALUATION)
                                 for linear, x in zip(linears, xs)], repeats) / PER_EVALUATION


def resolve(model: Any, setting: str = "auto", *, measure: Measure = measure_layer,
            cache: Any = None) -> LinearMode:
    """The linear mode of `model` under the ``compute.linear`` `setting`; wires the model when it dequantizes.

    Args:
        model: The mlx-lm model.
        setting: "auto" (measured, cached), "quantized" or "dequantized" (from `LADDER[0]` rows on).
        measure: The timing function (tests inject timings here).
        cache: A `engine.linear_mode_cache.LinearModeCache` (default: the one under CODECTX_HOME).

    A measurement that fails falls back to "quantized" with a warning; a cache
    that cannot be read or written is measured around, never trusted.
    """
    linears = block_linears(model)
    if not linears:
        notes = () if setting != "dequantized" else ("linear: the model has no quantized layers to dequantize",)
        return LinearMode("unquantized", source="no quantized layers", notes=notes)
    if setting == "quantized":
        return LinearMode("quantized")
    if setting == "dequantized":
        wire(model)
        return LinearMode("dequantized", LADDER[0])
    cache = cache if cache is not None else LinearModeCache()
    key = cache.key(linears, {"ladder": LADDER, "repeats": REPEATS, "per_evaluation": PER_EVALUATION})
    timings, source, start = cache.get(key), "cached", time.perf_counter()
    if timings is None or set(timings) != set(LADDER):
        try:
            timings, source = measure(model), "measured"
        except Exception as err:  # noqa: BLE001 - measuring is an optimization: fall back to the kernel
            logger.warning("linear mode: measuring failed (%s); using the quantized kernel", err)
            return LinearMode("quantized", source="fallback", notes=(f"linear: measuring failed: {err}",))
        cache.put(key, timings)
    seconds = time.perf_counter() - start if source == "measured" else 0.0
    mode, min_rows = decide(timings)
    if mode == "dequantized":
        wire(model)
    logger.info("linear mode: %s (%s)", mode if not min_rows else f"dequantized from {min_rows} rows", source)
    return LinearMode(mode, min_rows, source, timings, seconds)
