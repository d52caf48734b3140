"""The one seam for compute paths: `choose(model, options)` decides once, `ComputePath` runs it.

An engine computes its model's forward one of these ways, chosen once when the
engine is built (and by the draft model, the benchmarks and `codectx eval`
through the same function):

- exact MLX: the model's own call (attention and layers in MLX), with the
  compiled one-token decode / multi-token verify steps (`engine.compiled`)
  unless ``compile`` is off;
- NumPy attention: the model's own layers in MLX, attention in NumPy
  (`engine.cpu_attention`, wired into this model's attention modules only);
- NumPy forward: the whole layer arithmetic in NumPy (`engine.cpu_forward`),
  with the model's own call (NumPy attention) for the rare input it does not take.

Orthogonal to these, the linear mode (`engine.linear_mode`): whether a
quantized model's linear layers multiply prefill-sized inputs with the
quantized kernel or with weights dequantized for the call, measured once per
device and model shape ("auto"); decode-sized inputs keep the quantized kernel.

The `ComputePath` owns everything per model that a path needs (the NumPy
forward's weight views, the compiled steps); nothing is kept on the model.
`ComputePath.identity()` names what actually runs ("auto" resolved) and is
part of the checkpoint policy fingerprint, so checkpoints of one path are
never restored under another.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Sequence

import mlx.core as mx

from engine import blas, cpu_attention, cpu_forward, cuda_backend, decode_choice, last_row, linear_mode, qkv
from engine.compiled import VERIFY_MAX_TOKENS, CompiledDecodeStep
from engine.compute_options import ComputeOptions
from engine.decode_choice import DecodeKernels
from engine.linear_mode import LinearMode

logger = logging.getLogger(__name__)

__all__ = ["ComputeOptions", "ComputePath", "choose", "exact"]


NO_MLX_TRACE_ON_CUDA = "compile: no trace with MLX's kernels on CUDA (its dynamic row writes cost the whole cache buffer)"
"""The path's note where it traces nothing with MLX's kernels: a trace writes each layer's row with a dynamic
slice update (`engine.trace_caches`), which MLX's CUDA backend (0.32) launches with a thread per element of the
whole buffer, about 1 ms a layer at 131,072 rows on the H200 (docs/benchmarks.md, fourteenth session), and attends
over the whole buffer through a mask, off MLX's fused attention. There only our kernels' traces run, each chosen
by its own measurement (`engine.step_measure`; the bf16 one writes its rows by a scatter)."""


class ComputePath:
    """How one engine computes its model's forward (build it with `choose` or `exact`).

    Args:
        model: The mlx-lm model.
        attention: "mlx" or "numpy" (the model's attention modules are wired).
        numpy_forward: The model's `cpu_forward.NumpyForward`, or None.
        compiled: Build the compiled decode and verify steps.
        linear: The resolved `engine.linear_mode.LinearMode` (default: the
            quantized kernel, or "unquantized" for a model without quantized layers).
        kernels: Our decode kernels that run (`engine.decode_choice`; default: none).
        room: The ``compute.room`` setting: "auto", "on" or "off" (`room_ahead`).
        notes: Why an option asked for resolved to something else.
    """

    def __init__(self, model: Any, *, attention: str = "mlx",
                 numpy_forward: cpu_forward.NumpyForward | None = None,
                 compiled: bool = False, linear: LinearMode | None = None, kernels: DecodeKernels | None = None,
                 room: str = "auto", notes: Sequence[str] = ()) -> None:
        self.model = model
        self.attention = attention
        self.linear = linear or linear_mode.resolve(model, "quantized")
        self.kernels = kernels or DecodeKernels()
        last_row.wire(model)  # the head's call that a forward for the last logits narrows to one row
        self.kernels.wire(model)  # the classes our kernels are called through
        self.numpy_forward = numpy_forward
        self.compiled = compiled
        self.blas = blas.in_use()
        self.notes = tuple(notes)
        # With our kernels, decode is traced only over the stores they hold the traced step for, verify never.
        ours = frozenset(kind for kind, on in (("q8", self.kernels.step_traced),
                                               ("dense", self.kernels.step_traced_bf16)) if on)
        mlx_trace = compiled and not self.kernels.any
        if mlx_trace and cuda_backend.cuda_available():
            mlx_trace = False
            self.notes = (*self.notes, NO_MLX_TRACE_ON_CUDA)
        windows = attention != "numpy"  # keep NumPy's attention (a trace holds MLX's) over window caches
        self._decode = CompiledDecodeStep(model, 1, fallback=self.call, scope=self._traced_scope,
                                          ours=ours, windows=windows) if (compiled and ours) or mlx_trace else None
        self._verify = CompiledDecodeStep(model, VERIFY_MAX_TOKENS, fallback=self.call, windows=windows) \
            if mlx_trace else None
        # Positions of room a window cache's buffers keep past its rows (`engine.qkv.Room`). MLX's attention in a
        # trace attends over the whole buffers through a mask, so there room costs every step (`bench/room_mask.py`:
        # 24-73% a step on the CPU, docs/benchmarks.md, thirty-sixth session); our kernels' traces take the key
        # count and untraced steps read the rows only (on the CPU MLX's untraced step took 0.90-0.98x over buffers
        # of up to 13x its 8,192 rows: `bench/room_mask.py --aheads`, docs/benchmarks.md, thirty-seventh session).
        masked = mlx_trace and windows
        self.room_ahead = qkv.ROOM_AHEAD if room == "on" or (room == "auto" and not masked) else 0

    @property
    def kind(self) -> str:
        """"numpy-forward", "numpy" (attention only) or "mlx"."""
        return "numpy-forward" if self.numpy_forward is not None else self.attention

    def identity(self) -> str:
        """What runs, as the checkpoint policy's ``compute`` field."""
        identity = (f"attention={self.attention} forward={'numpy' if self.numpy_forward else 'mlx'} "
                    f"compile={'on' if self.compiled else 'off'} blas={self.blas} {self.linear.identity()}")
        kernels = self.kernels.identity()
        return f"{identity} {kernels}" if kernels else identity

    def describe(self) -> dict[str, Any]:
        """The resolved path for `Engine.stats()` and status."""
        return {"kind": self.kind, "attention": self.attention,
                "forward": "numpy" if self.numpy_forward is not None else "mlx",
                "compile": self.compiled, "blas": self.blas, "linear": self.linear.describe(),
                "room_ahead": self.room_ahead,
                "kernels": self.kernels.describe(),
                "notes": list(self.notes)}

    def call(self, tokens: mx.array, cache: Sequence[Any]) -> mx.array:
        """The model's own call, with NumPy attention and dequantized linears when this path uses them."""
        with self.linear.scope(tokens.size), self.kernels.scope(tokens.size):
            if self.attention != "numpy":
                return self.model(tokens, cache=cache)
            with cpu_attention.numpy_attention():
                return self.model(tokens, cache=cache)

    def _traced_scope(self, rows: int) -> contextlib.AbstractContextManager[None]:
        """The switches a traced step runs under (the trace holds what they chose; no trace inside it)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.linear.scope(rows))
        stack.enter_context(self.kernels.scope(rows, traced=True))
        return stack

    def forward(self, tokens: mx.array, cache: Sequence[Any], logits: str = "all") -> mx.array | None:
        """One forward: ids (1, n) -> logits (1, n, vocab), filling `cache`.

        Args:
            logits: "all"; "last" gives (1, 1, vocab) for the last position only;
                "none" when only the cache matters (the result is then None or
                an array that is never evaluated).
        """
        if self.numpy_forward is not None and cpu_forward.applies(tokens, cache):
            return self.numpy_forward(tokens, cache, logits)
        if self._decode is not None and tokens.shape == (1, 1):
            return self._decode(tokens, cache)
        if logits != "last" or tokens.shape[-1] == 1:  # (one row: decode's untraced step, nothing to leave out)
            out = self.call(tokens, cache)
            return out if logits != "last" else out[:, -1:, :]
        with last_row.scope():  # the head multiplies the last row only (`engine.last_row`)
            return self.call(tokens, cache)[:, -1:, :]

    def verify(self, tokens: mx.array, cache: Sequence[Any]) -> mx.array:
        """Speculative verification: the last token and the drafts in one forward (all logits)."""
        if tokens.shape[1] == 1 or self._verify is None:
            return self.forward(tokens, cache)
        return self._verify(tokens, cache)

    @property
    def decode_step(self) -> CompiledDecodeStep | None:
        """The compiled one-token step (None when this path does not compile)."""
        return self._decode

    @property
    def verify_step(self) -> CompiledDecodeStep | None:
        """The compiled verify step (None when this path does not compile it)."""
        return self._verify


def exact(model: Any) -> ComputePath:
    """The model's own MLX call, nothing compiled or wired: the reference every path is tested against."""
    return ComputePath(model)


def path_of(model_or_path: Any) -> ComputePath:
    """A `ComputePath` as it is; a bare model as its `exact` path."""
    return model_or_path if isinstance(model_or_path, ComputePath) else exact(model_or_path)


def choose(model: Any, options: ComputeOptions = ComputeOptions()) -> ComputePath:
    """The compute path for `model` under `options`, decided once (call it once per engine).

    "auto" resolves to NumPy attention on the CPU where the model's attention
    is llama/qwen-style (`engine.cpu_attention.SUPPORTED`), and to the NumPy
    forward where `engine.cpu_forward.supports` the model. An explicit "numpy"
    that cannot apply falls back to MLX with a warning; the path's `notes`
    say why. The linear mode is `engine.linear_mode.resolve`'s (measured for
    "auto" on a quantized model, once per device and model shape).
    """
    notes: list[str] = []
    attention = "mlx"
    if options.attention == "auto" and mx.default_device() != mx.cpu:
        notes.append("attention: MLX (the default device is not the CPU)")
    elif options.attention != "mlx":
        if cpu_attention.wire(model):
            attention = "numpy"
        else:
            notes.append(f"attention: MLX ({type(model).__module__} has no llama/qwen-style attention)")
    numpy_forward = None
    if attention == "numpy" and options.forward != "mlx":
        if cpu_forward.supports(model):
            numpy_forward = cpu_forward.NumpyForward(model, options.blas_threads or blas.threads_in_use())
        else:
            notes.append("forward: MLX (the NumPy forward takes float32 llama models)")
    elif options.forward == "numpy":
        notes.append("forward: MLX (the NumPy forward needs NumPy attention)")
    asked = {"attention": options.attention, "forward": options.forward}
    resolved = {"attention": attention, "forward": "numpy" if numpy_forward else "mlx"}
    for name, value in asked.items():
        if value == "numpy" and resolved[name] != "numpy":
            logger.warning("compute.%s 'numpy' does not apply here: %s", name, "; ".join(notes))
    linear = linear_mode.resolve(model, options.linear)
    kernels = decode_choice.resolve(model, options.kernels)
    wired = [name for name in ("attention_chunk", "step_traced_bf16", "rope_fused") if getattr(kernels, name)]
    if wired and not cpu_attention.wirable(model):  # the attention modules' wired call is where they run
        kernels = dataclasses.replace(kernels, **dict.fromkeys(wired, False), notes=(
            *kernels.notes, f"kernels: {' and '.join(wired)} need a llama/qwen-style attention "
                            f"({type(model).__module__})"))
    compiled = options.compile and numpy_forward is None
    if not compiled:
        kernels = decode_choice.untraced(kernels)
    path = ComputePath(model, attention=attention, numpy_forward=numpy_forward,
                       compiled=compiled, linear=linear, kernels=kernels, room=options.room,
                       notes=[*notes, *linear.notes, *kernels.notes])
    logger.info("compute path: %s", path.identity())
    return path
