"""A block's residual adds inside its projections' launches (decode-sized forwards over our CUDA linears).

mlx-lm's llama, qwen2 and qwen3 blocks compute ``h = x + attention(norm(x))`` and ``h + mlp(norm(h))``. In a
decode step on the GPU each add is a launch of its own: 128 a step of a 64-layer model, 0.33 ms of the 16.7 ms
an 8-bit step took in the H200's profile (docs/benchmarks.md, twelfth session), while the products before them
(the attention's o projection, the MLP's down projection) are our kernel, which can add the residual as it
stores its output. With ``residual_fused`` (measured at load beside our linears: `engine.residual_measure`), `wire` gives each
such block `ResidualCall`. While the switch is on, the block offers x to its attention's o projection and h to
its MLP's down projection (`added`); their call through our kernel takes it (`take`, in
`engine.linear_mode.DequantizingLinear`) and adds it in the launch (`engine.cuda_qmv.with_residual`, in float32,
rounded once). A projection that does not take it (another path, a shape the kernel does not take) leaves it, and
the block adds it as before. The MLP's is never offered inside its own trace (`engine.compiled_mlp`): that trace
would keep the residual of the step it was made in.
"""
from __future__ import annotations

import contextvars
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

from engine import compiled_mlp, cuda_qmv, decode_kernels

BLOCKS = frozenset({("mlx_lm.models.llama", "TransformerBlock"), ("mlx_lm.models.qwen2", "TransformerBlock"),
                    ("mlx_lm.models.qwen3", "TransformerBlock")})
"""mlx-lm's block classes whose call is ``h = x + self_attn(input_layernorm(x)); h + mlp(post_attention_layernorm(h))``
with the attention's output its ``o_proj``'s and the MLP's its ``down_proj``'s."""
_offered: contextvars.ContextVar[list | None] = contextvars.ContextVar("codectx_residual_offered", default=None)


class ResidualCall:
    """Mixed into a block's class by `wire`: decode-sized calls inside the switch add both residuals in their
    projections' launches where those take them."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        if not decode_kernels.residual_on() or x.size // x.shape[-1] > cuda_qmv.MAX_ROWS:
            return super().__call__(x, mask, cache)
        h = added(self.self_attn.o_proj, x, lambda: self.self_attn(self.input_layernorm(x), mask, cache))
        mlp = lambda: self.mlp(self.post_attention_layernorm(h))  # noqa: E731
        return h + mlp() if compiled_mlp.on() else added(self.mlp.down_proj, h, mlp)


def added(linear: Any, residual: mx.array, call: Callable[[], mx.array]) -> mx.array:
    """``residual + call()``, where `call`'s output is `linear`'s product: offered to `linear` while `call` runs,
    added by its launch if it takes it (`take`), else here."""
    offer = [linear, residual, False]
    token = _offered.set(offer)
    try:
        out = call()
    finally:
        _offered.reset(token)
    return out if offer[2] else residual + out


def take(linear: Any) -> mx.array | None:
    """The residual offered to `linear` now, which its product then adds (once); None: none is."""
    offer = _offered.get()
    if offer is None or offer[0] is not linear or offer[2]:
        return None
    offer[2] = True
    return offer[1]


def blocks(model: Any) -> list[Any]:
    """`model`'s blocks of one of `BLOCKS` (or a class derived from one, once wired) with quantized projections."""
    return [block for block in getattr(model, "layers", [])
            if any((cls.__module__, cls.__name__) in BLOCKS for cls in type(block).__mro__)
            and isinstance(getattr(getattr(block, "self_attn", None), "o_proj", None), nn.QuantizedLinear)
            and isinstance(getattr(getattr(block, "mlp", None), "down_proj", None), nn.QuantizedLinear)]


def wirable(model: Any) -> bool:
    """Whether `wire` gives any of `model`'s blocks the call."""
    return bool(blocks(model))


def wire(model: Any) -> int:
    """Give `model`'s `blocks` `ResidualCall`; how many have it."""
    found = blocks(model)
    for block in found:
        compiled_mlp.mix_in(block, ResidualCall)
    return len(found)
