"""The model's forward pass in NumPy, for llama-architecture models on MLX's CPU backend.

A warm hover's forward (7 new tokens over a 4,200-token context, default
model) took 323 ms with MLX running the layers and NumPy the attention.
MLX's one-row matmuls over the model's own weights moved 7.6 GB/s of weights
where NumPy's OpenBLAS moved 15.0 GB/s (`bench/cpu_forward.py` prints both).
`NumpyForward` runs the same layer arithmetic in NumPy, over zero-copy
float32 views of the model's own weights: 1.4x faster for those 7 tokens,
2.7x against MLX end to end (docs/benchmarks.md, *Engine (CPU)* → 7).

What stays in MLX is what gives the cache its meaning, so every cache the
engine uses works unchanged and checkpoints keep their format: RoPE (the
attention module's own `rope`, scaled variants included) and
`cache.update_and_fetch` (plain, windowed and 8-bit caches) with the mask
from `cache.make_mask`, exactly as the model file calls them. Attention is
`engine.cpu_attention.attend`, except for one new token over an 8-bit history,
which mlx-lm's quantized attention reads without dequantizing it.

It applies to mlx-lm's llama model file (SmolLM2, Llama, Mistral-style
checkpoints) with float32 weights, full attention on every layer, no
attention sinks and caches that all sit at one offset (`supports`, `applies`);
`engine.compute.choose` builds it where it applies and the `compute.forward`
setting allows it, and uses the model's own call for anything else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.base import create_attention_mask, quantized_scaled_dot_product_attention

from engine import blas, cpu_attention
from engine.last_row import LastRowEmbedding, LastRowLinear
from engine.cpu_attention import as_numpy

SUPPORTED_MODULES = frozenset({"mlx_lm.models.llama"})
LOGITS = ("all", "last", "none")

QUANTIZED_QUERY_LIMIT = 1
"""Up to this many new tokens, 8-bit history is attended by MLX's `quantized_matmul`
(mlx-lm's quantized attention) instead of being dequantized for NumPy: dequantizing
4,200 positions cost more than the whole 16-bit forward of one token (docs/benchmarks.md,
*Engine (CPU)* → 7)."""

_SKINNY_ROWS = 16
"""Up to this many rows, `W @ x.T` (OpenBLAS ran it 1.3–1.5x faster than `x @ W.T` for 7 rows)."""


@dataclass(frozen=True)
class _Linear:
    weight: np.ndarray  # (out, in), a view of the MLX weight
    bias: np.ndarray | None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x (n, in) -> (n, out)."""
        if x.shape[0] == 1:
            y = (self.weight @ x[0])[None]
        elif x.shape[0] <= _SKINNY_ROWS:
            y = (self.weight @ x.T).T
        else:
            y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class _Layer:
    attention_norm: np.ndarray
    mlp_norm: np.ndarray
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    gate: _Linear
    up: _Linear
    down: _Linear
    rope: nn.Module
    scale: float
    heads: int
    kv_heads: int


class NumpyForward:
    """``forward(tokens, cache, logits=...)``: the model's call, computed in NumPy.

    Args:
        model: An mlx-lm llama `Model` with float32 weights (`supports(model)`).
        threads: NumPy's BLAS threads while it runs the layers (0: the usable cores, at most 8).
    """

    def __init__(self, model: Any, threads: int = 0) -> None:
        inner = model.model
        self.eps = float(model.args.rms_norm_eps)
        self.embed = as_numpy(inner.embed_tokens.weight)
        self.final_norm = as_numpy(inner.norm.weight)
        tied = model.args.tie_word_embeddings
        self.head = _Linear(self.embed if tied else as_numpy(model.lm_head.weight), None)
        self.layers = [_layer(block) for block in inner.layers]
        self.threads = blas.thread_count(threads)

    def __call__(self, tokens: mx.array, cache: Sequence[Any], logits: str = "all") -> mx.array | None:
        """Logits for ``tokens`` of shape (1, n), filling ``cache`` as the model's own call does.

        Args:
            tokens: Token ids, shape (1, n).
            cache: One cache per layer (see `engine.kv`, `engine.window`).
            logits: "all" gives (1, n, vocab), "last" (1, 1, vocab) for the last
                position only, "none" returns None (the lm head is skipped).
        """
        if logits not in LOGITS:
            raise ValueError(f"logits must be one of {LOGITS}, got {logits!r}")
        # MLX's BLAS pool idles while NumPy computes: NumPy's gets the cores
        # (engine.cpu_attention gives it 1 while MLX runs the layers).
        cpu_attention.use_numpy_threads(self.threads)
        x = self.embed[np.asarray(tokens[0])]
        mask = create_attention_mask(x[None], cache[0])
        with np.errstate(over="ignore"):  # exp(-gate) overflows to inf for very negative gates: silu = -0
            for layer, layer_cache in zip(self.layers, cache):
                x = self._block(layer, x, mask, layer_cache)
        if logits == "none":
            return None
        if logits == "last":
            x = x[-1:]
        return mx.array(self.head(_rms_norm(x, self.final_norm, self.eps))[None])

    def _block(self, layer: _Layer, x: np.ndarray, mask: Any, cache: Any) -> np.ndarray:
        n = x.shape[0]
        h = _rms_norm(x, layer.attention_norm, self.eps)
        q = _heads(layer.q(h), layer.heads)
        k = _heads(layer.k(h), layer.kv_heads)
        v = _heads(layer.v(h), layer.kv_heads)
        offset = cache.offset
        queries = layer.rope(mx.array(q), offset=offset)
        keys, values = cache.update_and_fetch(layer.rope(mx.array(k), offset=offset), mx.array(v))
        if hasattr(cache, "bits") and n <= QUANTIZED_QUERY_LIMIT:
            attended = as_numpy(quantized_scaled_dot_product_attention(
                queries, keys, values, scale=layer.scale, mask=mask, group_size=cache.group_size, bits=cache.bits))
        else:
            keys, values = cpu_attention.dequantized(keys, values, cache)
            mx.eval(queries, keys, values)
            attended = cpu_attention.attend(np.asarray(queries), as_numpy(keys), as_numpy(values), layer.scale, mask)
        x = x + layer.o(attended[0].transpose(1, 0, 2).reshape(n, -1))
        h = _rms_norm(x, layer.mlp_norm, self.eps)
        gate = layer.gate(h)
        return x + layer.down(gate / (1 + np.exp(-gate)) * layer.up(h))


EMBEDDINGS = (nn.Embedding, LastRowEmbedding)
HEADS = (nn.Linear, LastRowLinear)
"""The classes of a model's embeddings and own head computed here: MLX's, or the same with the last-row call a
compute path wires (`engine.last_row`: computes the same, its head product here is our own)."""


def supports(model: Any) -> bool:
    """True when `NumpyForward` computes exactly what `model`'s own call does."""
    if type(model).__module__ not in SUPPORTED_MODULES or not hasattr(model, "model"):
        return False
    inner = model.model
    if getattr(inner, "swa_idx", None) is not None or not hasattr(inner, "embed_tokens"):
        return False
    if type(inner.embed_tokens) not in EMBEDDINGS or inner.embed_tokens.weight.dtype != mx.float32:
        return False
    if not model.args.tie_word_embeddings and (type(model.lm_head) not in HEADS
                                               or model.lm_head.weight.dtype != mx.float32):
        return False
    norms = [inner.norm] + [n for b in inner.layers for n in (b.input_layernorm, b.post_attention_layernorm)]
    if any(norm.weight.dtype != mx.float32 for norm in norms):
        return False
    for block in inner.layers:
        attention, mlp = block.self_attn, block.mlp
        linears = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                   mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(lin) is not nn.Linear or lin.weight.dtype != mx.float32 for lin in linears):
            return False
    return True


def applies(tokens: mx.array, cache: Sequence[Any]) -> bool:
    """True for one sequence (1, n) over caches that all hold the same number of tokens."""
    offsets = {getattr(c, "offset", None) for c in cache}
    return tokens.ndim == 2 and tokens.shape[0] == 1 and len(offsets) == 1 and None not in offsets


def _layer(block: Any) -> _Layer:
    attention, mlp = block.self_attn, block.mlp
    return _Layer(attention_norm=as_numpy(block.input_layernorm.weight),
                  mlp_norm=as_numpy(block.post_attention_layernorm.weight),
                  q=_linear(attention.q_proj), k=_linear(attention.k_proj), v=_linear(attention.v_proj),
                  o=_linear(attention.o_proj), gate=_linear(mlp.gate_proj), up=_linear(mlp.up_proj),
                  down=_linear(mlp.down_proj), rope=attention.rope, scale=float(attention.scale),
                  heads=attention.n_heads, kv_heads=attention.n_kv_heads)


def _linear(layer: nn.Linear) -> _Linear:
    return _Linear(as_numpy(layer.weight), as_numpy(layer["bias"]) if "bias" in layer else None)


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(n, heads * D) -> (1, heads, n, D), contiguous."""
    n = x.shape[0]
    return np.ascontiguousarray(x.reshape(n, heads, -1).transpose(1, 0, 2))[None]


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x * (1 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))) * weight
