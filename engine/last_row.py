"""The LM head on a forward's last row only, when only the last position's logits are read.

A prefill's final chunk asks for its last position's logits (`engine.compute.ComputePath.forward`
with ``logits="last"``). MLX evaluates what a graph asks for, whole: slicing the logits after the
head still multiplies every row of the chunk by the vocabulary. On the H100 the head of a
1,037-row chunk of the Qwen3-32B shape took 11.3 ms for logits nothing read (docs/benchmarks.md,
*GPU engine*, eighteenth session); the smaller the model, the larger the head's share.

`wire` gives a model's head module a class of its own (parameters, names and `isinstance` checks
unchanged) whose product, inside `scope()`, takes the last row of its input only: the model's own
`lm_head` (dense or quantized), or for a head tied to the embeddings, the embedding's `as_linear`.
The head is a per-row product, so the row it returns is the one the whole product would have
(the same kernel computes it; the quantized kernel may pick another tiling for one row, hence
the tolerance in tests/engine/test_last_row.py). Outside `scope()` nothing changes.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.switches import Switch

_switch = Switch("codectx_head_last_row")
scope = _switch.scope
"""Inside this block a wired head on this thread multiplies the last row of its input only."""


def last_row(x: mx.array) -> mx.array:
    """`x` (batch, rows, features), down to its last row inside `scope()`; as it is elsewhere."""
    return x[:, -1:, :] if _switch.on() and x.ndim == 3 and x.shape[1] > 1 else x


class _HeadCall:
    """The product of a model's own head (`__call__`), on the last row inside `scope()`."""

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(last_row(x))


class _TiedHeadCall:
    """The product of embeddings that serve as the head (`as_linear`), on the last row inside `scope()`."""

    def as_linear(self, x: mx.array) -> mx.array:
        return super().as_linear(last_row(x))


class LastRowLinear(_HeadCall, nn.Linear):
    """A model's own dense LM head (assigned as its class by `wire`)."""


class LastRowQuantizedLinear(_HeadCall, nn.QuantizedLinear):
    """A model's own quantized LM head (assigned as its class by `wire`)."""


class LastRowEmbedding(_TiedHeadCall, nn.Embedding):
    """Dense embeddings that serve as the LM head (assigned as their class by `wire`)."""


class LastRowQuantizedEmbedding(_TiedHeadCall, nn.QuantizedEmbedding):
    """Quantized embeddings that serve as the LM head (assigned as their class by `wire`)."""


_OWN = {nn.Linear: LastRowLinear, nn.QuantizedLinear: LastRowQuantizedLinear}
_TIED = {nn.Embedding: LastRowEmbedding, nn.QuantizedEmbedding: LastRowQuantizedEmbedding}


def wire(model: Any) -> str:
    """Give `model`'s head the last-row call (idempotent).

    Returns:
        "own" (its `lm_head`), "tied" (the embeddings its head is tied to) or "none" (a head of a
        kind left alone: the forward then multiplies every row, as before). A head whose class
        takes the last row already (`engine.linear_mode.DecodeHeadLinear`, a subclass) is "own".
    """
    head = getattr(model, "lm_head", None)
    if head is not None:
        head.__class__ = _OWN.get(type(head), type(head))
        return "own" if isinstance(head, tuple(_OWN.values())) else "none"
    tied = [m for _, m in model.named_modules() if type(m) in _TIED or type(m) in _TIED.values()]
    for module in tied:
        module.__class__ = _TIED.get(type(module), type(module))
    return "tied" if tied else "none"
