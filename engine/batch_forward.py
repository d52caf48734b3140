"""One NumPy forward call that advances several answers over one shared prefix.

The live cache holds a common prefix of P tokens (the hover lead-in). Each
answer (a *row*) appends its tokens after it, all rows into the same cache in
the order they are computed, so a row's tokens are interleaved with the
others'. `TreeLayout` keeps which row owns each position after the prefix and
gives every new token:

- its position: P + its index within its own row (RoPE sees exactly the
  positions a serial run of that row would give it);
- its mask: the whole prefix, its own row's earlier tokens and itself; never
  another row's (a block, or tree, mask, as an additive float32 bias). Keys
  between the prefix and the first token of the earliest row in the call are
  not read at all (rows prefill one after the other, so a prefill call skips
  every row before its own, and decode skips the rows that ended first).

`tree_forward` is `engine.cpu_forward.NumpyForward`'s layer arithmetic over
such a call: one stream of the weights and one read of the prefix's keys and
values for every row, where serial answers pay both per answer. RoPE still
runs through the attention module's own `rope`, each token as its own batch
entry with its own offset (`mx.fast.rope` takes a vector of offsets); a rope
that does not pass offsets straight to it gets one call per run of
consecutive positions instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.rope_utils import Llama3RoPE, SuScaledRoPE

from engine import cpu_attention
from engine.cpu_attention import as_numpy
from engine.cpu_forward import NumpyForward, _heads, _Layer, _rms_norm

_VECTOR_OFFSET_ROPES = (nn.RoPE, Llama3RoPE, SuScaledRoPE)
"""Ropes whose call hands `offset` to `mx.fast.rope` as it is (a vector of per-entry offsets works)."""


@dataclass(frozen=True)
class Placed:
    """New tokens placed by `TreeLayout.place`: what `tree_forward` needs to compute them.

    Attributes:
        positions: Each token's position (n,) int32.
        prefix: Tokens of the common prefix.
        start: The first cache position after the prefix any of these tokens may see (the
            first token of the earliest of their rows); keys in [prefix, start) are skipped.
        bias: (n, prefix + end - start) float32 over the keys [0, prefix) + [start, end):
            0 where a token attends, -inf elsewhere (`end`: the cache length after the call).
    """

    positions: np.ndarray
    prefix: int
    start: int
    bias: np.ndarray


class TreeLayout:
    """Which row owns each cache position after a common prefix of `prefix` tokens.

    Args:
        prefix: Tokens of the common prefix (the cache's offset when the rows start).
    """

    def __init__(self, prefix: int) -> None:
        self.prefix = prefix
        self._owner = np.empty(0, dtype=np.int64)  # row of each position after the prefix
        self._lengths: dict[int, int] = {}
        self._first: dict[int, int] = {}  # cache position of each row's first token

    @property
    def end(self) -> int:
        """Cache positions used: the prefix and every row's tokens so far."""
        return self.prefix + len(self._owner)

    def length(self, row: int) -> int:
        """Tokens of `row` placed so far."""
        return self._lengths.get(row, 0)

    def place(self, rows: Sequence[int]) -> Placed:
        """Place new tokens, one per entry of `rows` (the row each belongs to, in call order)."""
        rows = np.asarray(rows, dtype=np.int64)
        n, before = len(rows), self.end
        positions = np.empty(n, dtype=np.int32)
        for i, row in enumerate(rows.tolist()):
            positions[i] = self.prefix + self._lengths.get(row, 0)
            self._lengths[row] = self._lengths.get(row, 0) + 1
            self._first.setdefault(row, before + i)
        self._owner = np.concatenate([self._owner, rows])
        start = min(self._first[row] for row in set(rows.tolist()))
        seen = self._owner[start - self.prefix:]
        own = seen[None, :] == rows[:, None]
        own &= (start + np.arange(len(seen)))[None, :] <= (before + np.arange(n))[:, None]  # causal in its row
        bias = np.zeros((n, self.prefix + len(seen)), dtype=np.float32)
        bias[:, self.prefix:] = np.where(own, np.float32(0), np.float32(-np.inf))
        return Placed(positions, self.prefix, start, bias)


def tree_forward(forward: NumpyForward, cache: Sequence[Any], tokens: Sequence[int], placed: Placed,
                 want: Sequence[int]) -> np.ndarray:
    """Append `tokens` to `cache` as `placed` says; logits of the tokens at `want`.

    Args:
        forward: The engine's NumPy forward (its weight views).
        cache: The live per-layer cache; every layer returns all its keys from
            `update_and_fetch` (plain `KVCache`, or a window cache at dense positions).
        tokens: New token ids, any rows interleaved.
        placed: Their positions, keys and mask (`TreeLayout.place`).
        want: Indices into `tokens` whose logits are returned.

    Returns:
        Logits (len(want), vocab), float32.
    """
    cpu_attention.use_numpy_threads(forward.threads)
    x = forward.embed[np.asarray(tokens)]
    offsets = mx.array(placed.positions)
    with np.errstate(over="ignore"):  # as in NumpyForward: silu of very negative gates is -0
        for layer, layer_cache in zip(forward.layers, cache):
            x = _block(forward, layer, x, placed, offsets, layer_cache)
    return forward.head(_rms_norm(x[np.asarray(want, dtype=np.int64)], forward.final_norm, forward.eps))


def _block(forward: NumpyForward, layer: _Layer, x: np.ndarray, placed: Placed, offsets: mx.array,
           cache: Any) -> np.ndarray:
    n = x.shape[0]
    h = _rms_norm(x, layer.attention_norm, forward.eps)
    queries = _rope(layer.rope, layer.q(h).reshape(n, layer.heads, 1, -1), placed.positions, offsets)
    keys = _rope(layer.rope, layer.k(h).reshape(n, layer.kv_heads, 1, -1), placed.positions, offsets)
    keys, values = cache.update_and_fetch(keys.transpose(2, 1, 0, 3), mx.array(_heads(layer.v(h), layer.kv_heads)))
    if keys.shape[-2] != cache.offset:
        raise ValueError(f"the cache returned {keys.shape[-2]} keys of {cache.offset}")
    mx.eval(queries, keys, values)
    q = np.asarray(queries).transpose(2, 1, 0, 3)  # (n, H, 1, D) -> (1, H, n, D)
    keys, values = _seen(as_numpy(keys), placed), _seen(as_numpy(values), placed)
    attended = cpu_attention.attend(q, keys, values, layer.scale, placed.bias)
    x = x + layer.o(attended[0].transpose(1, 0, 2).reshape(n, -1))
    h = _rms_norm(x, layer.mlp_norm, forward.eps)
    gate = layer.gate(h)
    return x + layer.down(gate / (1 + np.exp(-gate)) * layer.up(h))


def _seen(kv: np.ndarray, placed: Placed) -> np.ndarray:
    """Keys or values (1, H_kv, L, D) at [0, prefix) + [start, L): rows these tokens never see are skipped."""
    if placed.start == placed.prefix:
        return kv
    return np.concatenate([kv[:, :, :placed.prefix], kv[:, :, placed.start:]], axis=2)


def _rope(rope: Any, x: np.ndarray, positions: np.ndarray, offsets: mx.array) -> mx.array:
    """`x` (n, heads, 1, D), token i roped at `positions[i]`."""
    x = mx.array(x)
    if type(rope) in _VECTOR_OFFSET_ROPES:
        return rope(x, offset=offsets)
    # One call per run of consecutive positions (a row's stretch within this call).
    cuts = [0, *(np.nonzero(np.diff(positions) != 1)[0] + 1).tolist(), len(positions)]
    runs = [rope(x[a:b].transpose(2, 1, 0, 3), offset=int(positions[a])).transpose(2, 1, 0, 3)
            for a, b in zip(cuts, cuts[1:])]
    return runs[0] if len(runs) == 1 else mx.concatenate(runs, axis=0)
