"""A model's own quantized LM head in decode: through our linear kernel where the blocks' linears are
(`engine.linear_mode.wire_head`), never dequantized; a head tied to the embeddings is left alone. The kernel is
CUDA's: a stand-in computing MLX's quantized product takes its place here (tests/engine/conftest.py)."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from test_linear_mode import quantized_model

from engine import linear_mode
from engine.decode_choice import DecodeKernels


def untied_llama(layers: int) -> llama.Model:
    """A tiny llama with its own LM head, every linear quantized (4-bit, group 64)."""
    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=layers, intermediate_size=256,
                           num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=256,
                           tie_word_embeddings=False)
    model = llama.Model(args)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    return model


def test_a_models_own_quantized_head_takes_our_linear_kernel_in_decode_and_a_tied_one_is_left_alone(
        tiny_model_dir, semantic_kernels):
    """On the H200 MLX's kernel read a Qwen3-32B head at 1.04 TB/s (0.42 ms of a 16.7 ms step): a model's own
    quantized head multiplies through our kernel where a one-token forward's linears do, never dequantized."""
    model = untied_llama(1)
    kernels = DecodeKernels(qmv=True, source="setting")
    token = mx.array([[3]])
    expected = model(token)
    kernels.wire(model)
    assert type(model.lm_head) is linear_mode.DecodeHeadLinear
    blocks = len(linear_mode.block_linears(model))
    with kernels.scope(rows=1):
        got = model(token)
    assert semantic_kernels.count("qmv") == blocks + 1  # the blocks' linears and the head
    assert mx.allclose(got, expected, atol=1e-4).item()
    with kernels.scope(rows=20):  # a prefill chunk: MLX's kernels, nothing dequantized for the head
        model(mx.array([list(range(20))]))
    assert semantic_kernels.count("qmv") == blocks + 1
    assert not linear_mode.wire_head(quantized_model(tiny_model_dir))  # the tiny llama ties its head


def test_a_forward_for_the_last_logits_multiplies_the_heads_last_row_only(monkeypatch):
    """A prefill's final chunk asks for its last position's logits (`ComputePath.forward(logits="last")`): a wired
    head multiplies that row alone (the head of a 1,037-row chunk took 11.3 ms on the H100 for logits nothing read),
    and the logits are the full forward's last row. Forwards for every position keep every row."""
    from engine.compute import ComputeOptions, choose
    from engine.kv import make_cache

    model = untied_llama(2)
    assert linear_mode.wire_head(model)
    path = choose(model, ComputeOptions(attention="mlx", forward="mlx", compile=False, linear="quantized"))
    rows = []
    product = nn.QuantizedLinear.__call__

    def recorded(self, x):  # MLX's quantized product (not ours), noting the head's rows
        if self is model.lm_head:
            rows.append(x.shape[1])
        return product(self, x)

    monkeypatch.setattr(nn.QuantizedLinear, "__call__", recorded)
    tokens = mx.array([list(range(3, 40))])
    every = path.forward(tokens, make_cache(model), logits="all")
    last = path.forward(tokens, make_cache(model), logits="last")
    assert rows == [37, 1]
    assert last.shape == (1, 1, 256)
    assert mx.allclose(last, every[:, -1:, :], atol=1e-3).item()
    assert mx.argmax(last[0, -1]).item() == mx.argmax(every[0, -1]).item()
