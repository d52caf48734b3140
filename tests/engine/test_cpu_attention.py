"""CPU attention through NumPy: the same numbers as MLX's SDPA, and when it applies."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from engine import cpu_attention


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


def test_dispatcher_falls_back_when_suspended_or_with_sinks():
    calls = []

    def original(q, k, v, cache, scale, mask, sinks=None):
        calls.append(sinks)
        return q

    attend = cpu_attention._dispatcher(original)
    q, k, v = _qkv(n=2)
    with cpu_attention.suspended():
        attend(q, k, v, None, scale=0.25, mask="causal")
    attend(q, k, v, None, scale=0.25, mask="causal", sinks=mx.zeros((6,)))
    assert len(calls) == 2
    out = attend(q, k, v, None, scale=0.25, mask="causal")
    assert len(calls) == 2 and out.shape == q.shape  # the NumPy path ran


def test_dispatcher_dequantizes_8_bit_caches():
    q, k, v = _qkv(n=1, L=20, D=64)

    class EightBit:
        bits, group_size = 8, 64

    kq, vq = mx.quantize(k, group_size=64, bits=8), mx.quantize(v, group_size=64, bits=8)
    out = cpu_attention._dispatcher(lambda *a, **kw: None)(q, kq, vq, EightBit(), scale=0.125, mask=None)
    expected = mx.fast.scaled_dot_product_attention(
        q, mx.dequantize(*kq, group_size=64, bits=8), mx.dequantize(*vq, group_size=64, bits=8),
        scale=0.125, mask=None)
    _close(out, expected)


def test_installed_model_gives_the_same_logits(monkeypatch):
    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                           rms_norm_eps=1e-5, max_position_embeddings=512)
    mx.random.seed(3)
    model = llama.Model(args)
    tokens = mx.array([[5, 9, 11, 3, 7, 2, 99, 4]])

    def run() -> mx.array:
        cache = [KVCache() for _ in model.layers]
        first = model(tokens[:, :6], cache=cache)
        return mx.concatenate([first, model(tokens[:, 6:], cache=cache)], axis=1)

    assert cpu_attention.install(model)
    assert cpu_attention.install(model)  # idempotent
    installed = llama.scaled_dot_product_attention
    assert hasattr(installed, "original")
    with cpu_attention.suspended():
        reference = run()
    _close(run(), reference, tol=1e-4)
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "off")
    assert not cpu_attention.install(model)
