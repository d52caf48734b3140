"""CPU attention through NumPy: the same numbers as MLX's SDPA, and when it applies."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from engine import cpu_attention
from engine.request import Request


def _qkv(B=1, H=6, H_kv=2, n=5, L=12, D=16, seed=0):
    mx.random.seed(seed)
    return (mx.random.normal((B, H, n, D)), mx.random.normal((B, H_kv, L, D)),
            mx.random.normal((B, H_kv, L, D)))


def _close(a: mx.array, b: mx.array, tol: float = 2e-5) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)), atol=tol, rtol=tol)


@pytest.mark.parametrize("n, mask", [(1, None), (5, None), (5, "causal"), (1, "causal"), (12, "causal")])
def test_matches_mlx_sdpa_for_none_and_causal_masks(n, mask):
    q, k, v = _qkv(n=n)
    _close(cpu_attention.attention(q, k, v, 0.25, mask),
           mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask))


def test_matches_mlx_sdpa_for_boolean_and_additive_array_masks():
    q, k, v = _qkv(B=2, n=4, L=9)
    allowed = mx.random.uniform(shape=(2, 1, 4, 9)) > 0.3
    allowed[..., 0] = True  # every query sees at least one key
    _close(cpu_attention.attention(q, k, v, 0.25, allowed),
           mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=allowed))
    per_head = mx.random.normal((2, 6, 4, 9))  # additive, one bias per query head
    _close(cpu_attention.attention(q, k, v, 0.25, per_head),
           mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=per_head))


def test_keeps_half_precision_dtype():
    q, k, v = (x.astype(mx.float16) for x in _qkv())
    _close(cpu_attention.attention(q, k, v, 0.25, "causal"),
           mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal"), tol=2e-3)


def test_rejects_an_unknown_mask_string():
    q, k, v = _qkv(n=3)
    with pytest.raises(ValueError, match="unknown attention mask"):
        cpu_attention.attention(q, k, v, 0.25, "sliding")


def _llama(seed: int = 3, hidden: int = 64) -> llama.Model:
    args = llama.ModelArgs(model_type="llama", hidden_size=hidden, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                           rms_norm_eps=1e-5, max_position_embeddings=512)
    mx.random.seed(seed)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


TOKENS = mx.array([[5, 9, 11, 3, 7, 2, 99, 4]])


def _run(model, numpy: bool, make_cache=None) -> mx.array:
    """Two chunks (6 + 2 tokens) through `model`, NumPy attention on this thread or not."""
    cache = make_cache() if make_cache else [KVCache() for _ in model.layers]
    with cpu_attention.numpy_attention(numpy):
        first = model(TOKENS[:, :6], cache=cache)
        return mx.concatenate([first, model(TOKENS[:, 6:], cache=cache)], axis=1)


@pytest.fixture
def mlx_sdpa_calls(monkeypatch):
    """Counts calls of MLX's own attention kernel (a spy on MLX, which we do not own)."""
    calls = []
    original = mx.fast.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", counting)
    return calls


def test_a_wired_model_attends_in_numpy_only_when_asked(mlx_sdpa_calls):
    model, reference = _llama(), _llama()
    own = _run(reference, numpy=False)
    classes = [type(layer.self_attn) for layer in model.layers]
    assert cpu_attention.wirable(model) and [type(layer.self_attn) for layer in model.layers] == classes  # asked only
    assert cpu_attention.wire(model) == 2 and cpu_attention.wire(model) == 2  # idempotent
    del mlx_sdpa_calls[:]
    assert mx.array_equal(_run(model, numpy=False), own).item()  # not asked: the model's own arithmetic
    assert len(mlx_sdpa_calls) == 4  # 2 layers x 2 chunks
    _close(_run(model, numpy=True), own, tol=1e-4)
    assert len(mlx_sdpa_calls) == 4  # NumPy attended, MLX's kernel was not called
    assert type(reference) is llama.Model and type(reference.layers[0].self_attn) is llama.Attention


def test_an_engine_with_numpy_attention_leaves_mlx_lm_untouched(tiny_loaded, mlx_sdpa_calls):
    from mlx_lm.models import base

    from engine.compute import ComputeOptions
    from engine.engine import Engine

    module_function = llama.scaled_dot_product_attention
    # No compiled step: its trace runs the model's own (MLX) attention by design.
    options = ComputeOptions(attention="numpy", forward="mlx", compile=False)
    engine = Engine(tiny_loaded, prefill_chunk=16, compute=options)
    try:
        assert engine.compute.kind == "numpy"
        assert engine.submit(Request(prompt_ids=list(range(3, 30)), max_tokens=3)).result().metrics.decode_tokens
        assert mlx_sdpa_calls == []  # prefill and decode attended through NumPy
    finally:
        engine.close()
    assert llama.scaled_dot_product_attention is module_function is base.scaled_dot_product_attention
    reference = llama.Model(tiny_loaded.model.args)  # same architecture, same weights, not wired
    reference.update(tiny_loaded.model.parameters())
    ids = mx.array([list(range(3, 30))])
    expected = reference(ids, cache=[KVCache() for _ in reference.layers])
    assert len(mlx_sdpa_calls) == len(reference.layers)  # the reference computed through MLX's kernel
    _close(engine.compute.call(ids, [KVCache() for _ in reference.layers]), expected, tol=1e-4)
    assert len(mlx_sdpa_calls) == len(reference.layers)


def test_8_bit_caches_are_dequantized():
    from mlx_lm.models.cache import QuantizedKVCache

    model = _llama(hidden=128)  # head dim 32: one quantization group
    cpu_attention.wire(model)

    def eight_bit():
        return [QuantizedKVCache(group_size=32, bits=8) for _ in model.layers]

    _close(_run(model, numpy=True, make_cache=eight_bit), _run(model, numpy=False, make_cache=eight_bit),
           tol=1e-3)


def test_qwen3_attention_with_head_norms():
    from mlx_lm.models import qwen3

    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=128, rms_norm_eps=1e-5,
                           head_dim=16, max_position_embeddings=512, rope_theta=10000.0,
                           tie_word_embeddings=True)
    mx.random.seed(4)
    model = qwen3.Model(args)
    for layer in model.layers:  # not all ones: a norm skipped or misplaced must change the numbers
        layer.self_attn.q_norm.weight = mx.random.uniform(0.5, 1.5, (16,))
        layer.self_attn.k_norm.weight = mx.random.uniform(0.5, 1.5, (16,))
    mx.eval(model.parameters())
    own = _run(model, numpy=False)
    assert cpu_attention.wire(model) == 2
    _close(_run(model, numpy=True), own, tol=1e-4)


def test_other_attention_is_not_wired():
    from spec_helpers import tiny_hybrid

    from engine.compute import ComputeOptions, choose

    hybrid = tiny_hybrid(seed=1)
    assert not cpu_attention.wirable(hybrid) and cpu_attention.wire(hybrid) == 0
    path = choose(hybrid, ComputeOptions(attention="numpy"))
    assert path.kind == "mlx" and "llama/qwen-style" in path.notes[0]
