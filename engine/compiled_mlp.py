"""Decode's MLPs replayed from a trace (`mx.compile`), where `engine.decode_choice` measured it faster.

On the H200 building a decode step's graph in Python and submitting it took as long as the whole
step (docs/benchmarks.md, *GPU engine*, eighth session; how much of the submitting waits for the
device is measured apart, eleventh session). A block's MLP (three linears and the
activation) is the same computation at every step, one row in and one row out, so it can be traced
once and replayed: no Python runs for it during a step (on the CPU with our kernels stubbed,
`bench/decode_build.py` measures what that saves in building a step).

`wire` gives each block's MLP a call that, while `on()` (a one-token forward of a compute path
that chose it) and for one row, runs its trace. The trace is made at the first such call on this
thread's switches, so it holds the kernels the path runs for decode (`engine.cuda_qmv`: the
switch is on only together with them). Any other call is the MLP's own. Each trace's first call is
evaluated where it is made (MLX compiles a trace's kernels when it first evaluates them), so a trace
that cannot be made or run is caught there: logged (once per process) and that MLP stays on its own
call. The engine takes it only where it was measured at load (the first block, one row, traced
against its own call and checked); `ComputePath.identity()` names it. A trace holds the weights it
was made with: a model whose weights are replaced is wired again (`wire`, which drops the traces).
"""
from __future__ import annotations

import functools
import logging
from typing import Any

import mlx.core as mx

from engine.switches import Switch

logger = logging.getLogger(__name__)

_on = Switch("codectx_compiled_mlp")
on = _on.on
"""Whether one-row MLP calls on this thread replay their trace now."""
scope = _on.scope
"""Inside this block (`scope(True)`), wired MLPs replay their trace for one row."""
_FAILED = object()
_warned: list[str] = []


class CompiledCall:
    """Mixed into a block's MLP class by `wire`: one-row calls inside `scope` replay the MLP's trace."""

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if args or kwargs or not (_on.on() and x.size == x.shape[-1]):
            return super().__call__(x, *args, **kwargs)
        traced = self.__dict__.get("_codectx_trace")  # the instance's own, outside the module's parameters
        if traced is _FAILED:
            return super().__call__(x)
        if traced is not None:
            return traced(x)
        plain = super().__call__
        traced = mx.compile(lambda v: plain(v))
        try:
            out = traced(x)
            mx.eval(out)  # its kernels are compiled here, once: a failure is caught now, not in a later step
        except Exception as err:  # noqa: BLE001 - an optimization: the MLP's own call is always right
            if not _warned:
                _warned.append(str(err))
                logger.warning("compiled MLP unavailable, using its own call: %s", err)
            self.__dict__["_codectx_trace"] = _FAILED
            return super().__call__(x)
        self.__dict__["_codectx_trace"] = traced
        return out


@functools.lru_cache(maxsize=None)
def _mixed_class(mixin: type, cls: type) -> type:
    return type(cls.__name__, (mixin, cls), {"__doc__": cls.__doc__})


def mix_in(module: Any, mixin: type) -> None:
    """Give `module` (this instance) a subclass of its class whose call is `mixin`'s first (once: a module
    that has it already keeps its class)."""
    if not isinstance(module, mixin):
        module.__class__ = _mixed_class(mixin, type(module))


def block_mlps(model: Any) -> list[Any]:
    """Each block's MLP (the blocks' ``mlp``), in order."""
    return [layer.mlp for layer in getattr(model, "layers", []) if callable(getattr(layer, "mlp", None))]


def wire(model: Any) -> int:
    """Give every block's MLP the compiled call, dropping any trace made before (the weights may have
    changed). Returns how many blocks have it."""
    mlps = block_mlps(model)
    for mlp in mlps:
        mix_in(mlp, CompiledCall)
        mlp.__dict__.pop("_codectx_trace", None)
    return len(mlps)


def first_mlp(model: Any) -> Any | None:
    """The first block's MLP (what `engine.decode_measure` times), or None."""
    return next(iter(block_mlps(model)), None)
