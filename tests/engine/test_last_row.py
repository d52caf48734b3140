"""A forward asked for its last position's logits multiplies the LM head's last row only, whatever the
head: a model's own (dense or quantized) or one tied to the embeddings (dense or quantized), on every
MLX path, not only where our CUDA kernels are wired (`engine.last_row`). The logits are the full
forward's last row; a forward for every position keeps every row."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from test_decode_head import untied_llama
from test_linear_mode import quantized_model

from engine import last_row
from engine.compute import ComputeOptions, choose
from engine.kv import make_cache

MLX_PATH = ComputeOptions(attention="mlx", forward="mlx", compile=False, linear="quantized")
TOKENS = mx.array([list(range(3, 40))])


def rows_through_the_head(monkeypatch, model) -> list[int]:
    """The rows each head product of `model` multiplies, recorded as MLX's own products run."""
    rows: list[int] = []
    for cls, name in ((nn.Linear, "__call__"), (nn.QuantizedLinear, "__call__"), (nn.Embedding, "as_linear"),
                      (nn.QuantizedEmbedding, "as_linear")):
        product = getattr(cls, name)

        def recorded(self, x, product=product, name=name):
            if name == "as_linear" or self is getattr(model, "lm_head", None):
                rows.append(x.shape[1])
            return product(self, x)

        monkeypatch.setattr(cls, name, recorded)
    return rows


@pytest.mark.parametrize("build, kind, head_class", [
    (lambda loaded, directory: loaded.model, "tied", last_row.LastRowEmbedding),
    (lambda loaded, directory: quantized_model(directory), "tied", last_row.LastRowQuantizedEmbedding),
    (lambda loaded, directory: untied_llama(2), "own", last_row.LastRowQuantizedLinear),
], ids=["tied-dense", "tied-quantized", "own-quantized"])
def test_the_last_logits_multiply_one_row_of_the_head(monkeypatch, tiny_loaded, tiny_model_dir, build, kind,
                                                      head_class):
    model = build(tiny_loaded, tiny_model_dir)
    every = model(TOKENS, cache=make_cache(model))  # the model's own call, before anything is wired
    path = choose(model, MLX_PATH)
    head = model.lm_head if kind == "own" else model.model.embed_tokens
    assert type(head) is head_class and last_row.wire(model) == kind  # idempotent
    rows = rows_through_the_head(monkeypatch, model)
    all_rows = path.forward(TOKENS, make_cache(model), logits="all")
    last = path.forward(TOKENS, make_cache(model), logits="last")
    assert rows == [37, 1]
    assert last.shape == (1, 1, every.shape[-1])
    assert mx.array_equal(all_rows, every).item()  # outside the scope nothing changed
    assert mx.allclose(last, every[:, -1:, :], atol=1e-4).item()
    assert mx.argmax(last[0, -1]).item() == mx.argmax(every[0, -1]).item()


def test_a_head_of_another_kind_is_left_alone():
    class Softcapped(nn.Module):  # a head that is not a plain product: not ours to narrow
        def __call__(self, x):
            return mx.tanh(x)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = Softcapped()

    model = Model()
    assert last_row.wire(model) == "none" and type(model.lm_head) is Softcapped
