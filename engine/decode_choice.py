"""Whether our CUDA decode kernels run, chosen by measurement per device and model shape.

`engine.cuda_qmv` (quantized linears of a few rows) and `engine.cuda_attention`
(one query over an 8-bit cache) exist only on MLX's CUDA backend. When a model
loads there with ``compute.kernels: auto``, `engine.decode_measure.measure` times each against
the MLX call it would replace, on the model's own shapes, and checks that it computes
the same thing:

- linears: one transformer block's quantized linears on one input row, ours
  against `mx.quantized_matmul`, the block repeated `REPEAT` times so that one
  evaluation holds many products, as a decode step does (112 for a 7-linear block);
  then those of few, long rows (a down or o projection) split over K (``qmv_split``,
  `engine.cuda_qmv_split`) against ours unsplit; only together with our linears;
- attention: `ATTENTION_KEYS` 8-bit keys and values with the model's KV heads
  and head dim, ours against dequantizing them and MLX's fused attention (the
  engine's path for an 8-bit cache on CUDA without this kernel), several caches taken in
  turn (as a step's layers read theirs: from memory, not from L2); ours are four:
  `engine.cuda_attention`'s on the CUDA cores (``attention``) and three on tensor cores where the
  shape fits them, `engine.cuda_attention_mma`'s (``attention_mma``),
  `engine.cuda_attention_staged`'s (``attention_staged``, its bytes staged through shared memory) and
  `engine.cuda_attention_transposed`'s (``attention_transposed``, the same with keys on the products' rows,
  for at most 8 query heads per KV head);
  of those that beat MLX's, the fastest runs (on a near tie the one that ranked first at long context,
  `decode_measure.faster_attention`);
- chunk attention (``attention_chunk``, `engine.cuda_chunk_attention`): `CHUNK_ROWS` queries over
  a bf16 cache, a forward's layers per evaluation, each evaluation at a new key count as in use
  (MLX's cuDNN attention then builds a plan each time), against MLX's attention; and over an 8-bit cache's
  rows as they lie (``attention_chunk_q8``) against the rows dequantized and attended as without it
  (`engine.chunk_measure`);
- the 8-bit cache write (``kv_write``, `engine.cuda_kv_write`): a decode step's rows written in place,
  with our attention reading them, queued as decode queues its steps, against MLX's slice updates;
  only where one of our attention kernels runs (the one reader it orders after itself);
- decode's MLPs replayed from a trace (``mlp_compiled``, `engine.compiled_mlp`): the first block's MLP
  on one row with our linears, `REPEAT` calls per evaluation, traced against its own call (checked
  against it like the kernels); only together with our linears (what the trace holds);
- a block's linears of one input in one launch each (``qmv_fused``, `engine.fused_linears`: q, k and v; the
  MLP's gate and up with its activation): the first block's on one row, `REPEAT` per evaluation, against our
  kernel once per linear and mlx-lm's activation (checked against our kernel's products and the MLP's own
  call); only together with our linears;
- one token's per-head norms and RoPE in one launch (``rope_fused``, `engine.cuda_qk_rope`): the first
  block's, `REPEAT` per evaluation, against the module's own (checked against them at
  `decode_measure.ROPE_POSITION`); where the attention modules can be wired;
- a block's residual adds in its projections' launches (``residual_fused``, `engine.fused_residual`): the first
  block's o and down projections on one row, `REPEAT` per evaluation, our kernel and MLX's add against the add in
  the launch (checked against them); where the blocks can be wired, only together with our linears;
- the whole one-token step replayed from its trace (`engine.compiled`), over 8-bit caches (``step_traced``,
  only with the in-place write) and over bf16 ones (``step_traced_bf16``, only with the chunk attention),
  measured last, on the whole model with the kernels chosen before it (`engine.step_measure`): queued
  steps over a short cache, traced against plain, checked first.

A kernel runs when it is at least `MARGIN` faster and its relative error
against a float32 reference is under `decode_measure.MAX_ERROR` (MLX's own 4-bit product
measured 8e-3 there), except those `HELD_BACK` (never in ``auto``) and those `FOR_THE_TRACE`
(chosen with a trace that wins holding them, even where they lost alone). Timings are cached with the linear mode's
(``CODECTX_HOME/compute/linear-modes.json``), under a hash of our kernels' code
(`cuda_backend.code_version`): changed code is measured and checked again. ``mlx`` keeps
MLX's kernels; ``codectx`` uses ours wherever they apply on CUDA. On any other backend there is
nothing to choose. What runs is part of `engine.compute.ComputePath.identity()`,
hence of the checkpoint policy fingerprint.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from engine import (chunk_measure, compiled_mlp, cpu_attention, cuda_qmv, decode_kernels, fused_linears, fused_residual,
                    linear_mode, residual_measure)
from engine.chunk_measure import CHUNK_CALLS, CHUNK_ROWS
from engine.cuda_backend import code_version, cuda_available
from engine.decode_measure import (ATTENTION_KEYS, ATTENTION_NEAR, ATTENTION_TIMINGS, MARGIN, REPEAT, Timings,
                                   attention_kernels, attention_shape, compute_dtype, faster_attention)
from engine.decode_measure import measure as measure_kernels
from engine.linear_mode import first_block_linears
from engine.linear_mode_cache import LinearModeCache
from engine.step_measure import STEPS, TRACE_KEYS, TRACED, time_traced_step

logger = logging.getLogger(__name__)

KERNEL_NAMES = ("qmv", "attention", "attention_mma", "attention_chunk", "kv_write", "mlp_compiled", "step_traced",
                "step_traced_bf16", "qmv_fused", "rope_fused", "attention_staged", "attention_transposed",
                "attention_chunk_q8", "qmv_split", "residual_fused")
NEEDS = (("kv_write", tuple(ATTENTION_TIMINGS), "our attention"),  # the one reader it orders after itself
         ("mlp_compiled", ("qmv",), "qmv"),  # the trace holds our linears
         ("qmv_fused", ("qmv",), "qmv"),  # one launch of our linears' kernel
         ("qmv_split", ("qmv",), "qmv"),  # our linears' kernel, split
         ("residual_fused", ("qmv",), "qmv"),  # added in our linears' launches
         *((name, (kernel,), kernel) for name, _, _, kernel in TRACED))  # what each trace holds
"""(kernel, any of these must run too, named in the note) for the kernels that run only beside others."""
HELD_BACK = {"step_traced_bf16": "slower than the plain step at 131,072 keys on the H200 though faster over the "
                                   "8,192 rows it is timed over (docs/benchmarks.md, fifteenth session, run h)"}
"""Kernels `auto` does not run whatever their load-time timings say, and why (``codectx`` still forces them): the bf16
trace's cost grows with the context faster than its measurement sees (run h: a 25.7 ms step against the untraced
17.8 of run d at 131k; the suspect is its row write copying each layer's whole buffers, `engine.trace_caches`)."""
FOR_THE_TRACE = (("step_traced", "kv_write"),)
"""(traced step, a kernel it needs that serves nothing but the steps the trace replays): where the trace wins, the
kernel runs with it even where it lost alone. Its own timing is of one-token steps outside a trace, which the
trace replaces; the trace is timed holding it against the plain step without it (`measure_all`). On the H100 the
in-place write lost alone (1.67 against 1.48 ms) and took the 8-bit trace down with it."""


@dataclass(frozen=True)
class DecodeKernels:
    """Which of our decode kernels a compute path runs.

    Attributes:
        qmv: `engine.cuda_qmv` for quantized linears of at most `cuda_qmv.MAX_ROWS` rows (the blocks' and a
            model's own LM head, `linear_mode.wire_head`).
        attention: `engine.cuda_attention` for one query over an 8-bit cache.
        source: "measured", "cached", "setting", "not CUDA" or "fallback".
        timings: What the choice was made from.
        notes: Why a kernel was not chosen.
        attention_mma: `engine.cuda_attention_mma` (tensor cores) for that attention instead.
        attention_chunk: `engine.cuda_chunk_attention` for forwards of 2..`decode_kernels.CHUNK_MAX_ROWS`
            tokens over a bf16 cache.
        kv_write: `engine.cuda_kv_write` for a one-token forward's 8-bit cache writes (only with our
            attention: the one reader it orders after itself).
        mlp_compiled: `engine.compiled_mlp` for a one-token forward's MLPs (only with `qmv`).
        step_traced: a one-token forward over 8-bit caches replayed whole from its trace (`engine.compiled`,
            our kernels in it; only with `kv_write`, whose in-place write and our attention take the
            position and key count as arrays).
        step_traced_bf16: the same over bf16 caches (only with `attention_chunk`, whose kernel attends the
            one query with the key count as an array).
        qmv_fused: `engine.fused_linears` for a decode-sized forward's linears of one input (a block's q, k
            and v; its MLP's gate and up with the activation), one launch each (only with `qmv`).
        rope_fused: `engine.cuda_qk_rope` for one token's per-head norms and RoPE, one launch a block.
        attention_staged: `engine.cuda_attention_staged` (tensor cores, bytes staged through shared memory)
            for the one-query attention instead.
        attention_transposed: `engine.cuda_attention_transposed` (the same, keys and dimensions on the
            products' rows, query heads on their columns) for the one-query attention instead.
        attention_chunk_q8: `engine.cuda_chunk_attention`'s 8-bit kernel for forwards of
            2..`decode_kernels.CHUNK_MAX_ROWS` tokens over an 8-bit cache's dense rows, read where they lie.
        qmv_split: `engine.cuda_qmv_split` for our linears of few, long rows (a down or o projection), each
            warp's rows split over K (only with `qmv`).
        residual_fused: `engine.fused_residual` for a decode-sized forward's residual adds, each in the launch of
            the projection before it (a block's o and down projections; only with `qmv`).
        measure_s: Seconds measuring took at this load, a failed attempt's included (0 when cached, set or
            not measured).
    """

    qmv: bool = False
    attention: bool = False
    source: str = "not CUDA"
    timings: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    attention_mma: bool = False
    attention_chunk: bool = False
    kv_write: bool = False
    mlp_compiled: bool = False
    step_traced: bool = False
    step_traced_bf16: bool = False
    qmv_fused: bool = False
    rope_fused: bool = False
    attention_staged: bool = False
    attention_transposed: bool = False
    attention_chunk_q8: bool = False
    qmv_split: bool = False
    residual_fused: bool = False
    measure_s: float = 0.0

    @property
    def any(self) -> bool:
        """Whether any of our kernels runs."""
        return any(getattr(self, name) for name in KERNEL_NAMES)

    def identity(self) -> str:
        """The part of `ComputePath.identity()` naming our kernels ("" when none runs)."""
        on = [name for name in KERNEL_NAMES if getattr(self, name)]
        return f"kernels={'+'.join(on)}" if on else ""

    def scope(self, rows: int, traced: bool = False) -> contextlib.AbstractContextManager[None]:
        """The context a forward over `rows` rows runs in; `traced`: inside a traced step (`engine.compiled`),
        which holds the MLPs itself."""
        qmv = self.qmv and rows <= cuda_qmv.MAX_ROWS
        attention = (self.attention or self.attention_mma or self.attention_staged or self.attention_transposed) \
            and rows == 1
        chunk = self.attention_chunk and (1 < rows <= decode_kernels.CHUNK_MAX_ROWS
                                          or traced and rows == 1 and self.step_traced_bf16)
        kv_write = self.kv_write and attention  # its one reader in the step is our attention
        mlp = self.mlp_compiled and qmv and rows == 1 and not traced  # the trace holds our linears
        rope = self.rope_fused and rows == 1
        chunk_q8 = self.attention_chunk_q8 and 1 < rows <= decode_kernels.CHUNK_MAX_ROWS
        return decode_kernels.scope(qmv, attention, self.attention_mma, chunk, kv_write, mlp, self.qmv_fused, rope,
                                    staged=self.attention_staged, transposed=self.attention_transposed,
                                    chunk_q8=chunk_q8, split=self.qmv_split, residual=self.residual_fused) \
            if qmv or attention or chunk or mlp or rope or chunk_q8 else contextlib.nullcontext()

    def wire(self, model: Any) -> None:
        """Give the model's layers the classes the chosen kernels are called through (our linears, the MLPs
        that replay a trace, the attention modules' wired call); the compute path does it once when built."""
        if self.qmv:
            linear_mode.wire(model)
            linear_mode.wire_head(model)
        if self.qmv_fused:  # before the compiled MLPs, whose trace then holds the fused call
            fused_linears.wire(model)
        if self.mlp_compiled:
            compiled_mlp.wire(model)
        if self.residual_fused:
            fused_residual.wire(model)
        if self.attention_chunk or self.qmv_fused or self.rope_fused:
            cpu_attention.wire(model)  # the attention modules' call that reaches the chunk kernel, the fused q, k, v

    def describe(self) -> dict[str, Any]:
        """For `ComputePath.describe()` (status, doctor, `Engine.stats()`)."""
        return {**{name: getattr(self, name) for name in KERNEL_NAMES}, "source": self.source,
                "measure_s": round(self.measure_s, 3),
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
        measure: The timing function (tests inject timings here; default `measure_all`).
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
        return DecodeKernels(True, True, "setting", attention_chunk=True, attention_chunk_q8=_q8_chunk_takes(model),
                             kv_write=ours, mlp_compiled=True, qmv_split=_splits_a_linear(model),
                             step_traced=ours, step_traced_bf16=_chunk_kernel_takes_one_query(model), qmv_fused=True,
                             rope_fused=True, residual_fused=fused_residual.wirable(model),
                             notes=() if ours else ("kernels: kv_write needs our attention, which does not take "
                                                    "this model's heads",))
    linears = first_block_linears(model)
    cache = cache if cache is not None else LinearModeCache()
    key = cache.key(linears, {"kernels": KERNEL_NAMES, "keys": ATTENTION_KEYS, "repeat": REPEAT,
                              "attention": attention_shape(model), "chunk": [CHUNK_ROWS, CHUNK_CALLS],
                              # the traced step is timed on the whole model: its host work grows with the layers
                              "step": [TRACE_KEYS, STEPS, len(getattr(model, "layers", []))],
                              "code": code_version()})
    timings, source, began = cache.get(key, parse=str), "cached", time.perf_counter()
    if timings is None:
        try:
            timings, source = (measure or measure_all)(model), "measured"
        except Exception as err:  # noqa: BLE001 - the kernels are an optimization: keep MLX's
            logger.warning("decode kernels: measuring failed (%s); using MLX's", err)
            return DecodeKernels(source="fallback", notes=(f"kernels: measuring failed: {err}",),
                                 measure_s=time.perf_counter() - began)  # what the failed attempt cost
        cache.put(key, timings)
    chosen, notes = choose_kernels(timings)
    seconds = time.perf_counter() - began if source == "measured" else 0.0
    logger.info("decode kernels: %s (%s%s)", chosen, source, f", {seconds:.1f} s" if seconds else "")
    return DecodeKernels(source=source, timings=dict(timings), notes=notes, measure_s=seconds, **chosen)


def measure_all(model: Any) -> Timings:
    """Each kernel timed (`engine.decode_measure.measure`, `engine.residual_measure.measure`,
    `engine.chunk_measure.measure`), then the step traced with those that would run
    (`engine.step_measure.time_traced_step`)."""
    timings = measure_kernels(model)
    if "qmv" in timings:  # (beside our linears only)
        timings.update(residual_measure.measure(model))
    timings.update(chunk_measure.measure(model, cpu_attention.wirable(model)))
    chosen, _ = choose_kernels(timings)
    held = {kernel: True for trace, kernel in FOR_THE_TRACE if _holdable(trace, kernel, chosen, timings)
            and _needs_met(kernel, chosen)}
    return {**timings, **time_traced_step(model, DecodeKernels(source="measured", **{**chosen, **held}),
                                          baseline=DecodeKernels(source="measured", **chosen))}


def choose_kernels(timings: Mapping[str, tuple[float, float]]) -> tuple[dict[str, bool], tuple[str, ...]]:
    """What runs (`decide`, and of the attention kernels that win, the fastest) and why the others do not."""
    chosen = decide(timings)
    notes = [f"kernels: {name} {'not measured here' if name not in timings else 'slower than MLX'}"
             for name in KERNEL_NAMES if not chosen[name]]
    winners = {name: timings[name] for name in ATTENTION_TIMINGS if chosen[name]}
    fastest = faster_attention(winners)
    for slower in winners:  # one kernel for one call
        if slower != fastest:
            chosen[slower] = False
            near = timings[slower][1] <= timings[fastest][1]  # a near tie the kernel first at long context wins
            notes.append(f"kernels: {slower} {f'within {ATTENTION_NEAR:.0%} of' if near else 'slower than'} {fastest}")
    for name, why in HELD_BACK.items():
        if chosen[name]:
            chosen[name] = False
            notes.append(f"kernels: {name} held back: {why}")
    for trace, kernel in FOR_THE_TRACE:
        if chosen[trace] and _holdable(trace, kernel, chosen, timings):
            chosen[kernel] = True
            notes = [n for n in notes if n != f"kernels: {kernel} slower than MLX"]
            notes.append(f"kernels: {kernel} slower alone, chosen for {trace}")
    for name, needs, what in NEEDS:  # in order: a rule may drop what a later one needs
        if chosen[name] and not _needs_met(name, chosen):
            chosen[name] = False
            notes.append(f"kernels: {name} needs {what}")
    return chosen, tuple(notes)


def _holdable(trace: str, kernel: str, chosen: Mapping[str, bool], timings: Mapping[str, Any]) -> bool:
    """Whether `trace` may hold `kernel` (`FOR_THE_TRACE`): measured (its check passed) and lost alone, neither
    of them held back."""
    return kernel in timings and not chosen[kernel] and trace not in HELD_BACK and kernel not in HELD_BACK


def untraced(kernels: DecodeKernels) -> DecodeKernels:
    """`kernels` for a path that traces nothing (``compute.compile`` off): a kernel that runs only for a trace
    (`FOR_THE_TRACE`: running, though its own timing lost) is off."""
    won = decide(kernels.timings)
    held = [kernel for _, kernel in FOR_THE_TRACE if getattr(kernels, kernel) and kernel in kernels.timings
            and not won[kernel]]
    if not held:
        return kernels
    off = tuple(f"kernels: {k} off: held for a trace this path does not make" for k in held)
    return replace(kernels, **dict.fromkeys(held, False), notes=(*kernels.notes, *off))


def _needs_met(name: str, chosen: Mapping[str, bool]) -> bool:
    """Whether `chosen` runs what `name` runs beside (`NEEDS`; True for a kernel that needs nothing)."""
    return all(any(chosen[n] for n in needs) for kernel, needs, _ in NEEDS if kernel == name)


def _chunk_kernel_takes_one_query(model: Any) -> bool:
    """Whether the chunk kernel attends a traced bf16 step's one query for `model` (its heads, its dtype, and
    attention modules the wired call reaches it through)."""
    from engine import cuda_chunk_attention

    shape = attention_shape(model)
    return (shape is not None and cpu_attention.wirable(model)
            and cuda_chunk_attention.shape_problem(1, shape[0] // shape[1], shape[2], compute_dtype(model)) is None)


def _splits_a_linear(model: Any) -> bool:
    """Whether `engine.cuda_qmv_split` splits one of `model`'s first block's linears on one row."""
    from engine import cuda_qmv_split

    return any(cuda_qmv_split.linear_split(m) > 1 for m in first_block_linears(model))


def _q8_chunk_takes(model: Any) -> bool:
    """Whether the 8-bit chunk kernel takes `model`'s rows in the engine's 8-bit cache (dim 128, groups of 64,
    scales in the model's dtype: bf16)."""
    from engine import cuda_chunk_attention

    shape = attention_shape(model)
    return shape is not None and cuda_chunk_attention.q8_rows_problem(shape[2], 8, 64, compute_dtype(model)) is None


def _our_attention_takes(model: Any) -> bool:
    """Whether one of our decode attention kernels takes `model`'s heads over an 8-bit cache (the one reader
    an in-place cache write is ordered before: elsewhere each layer would evaluate the write first)."""
    shape = attention_shape(model)
    return shape is not None and bool(attention_kernels(shape))


