"""Windowed prefill as a cache policy: dense equivalence, masks, trim, state, layout."""
from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from engine.request import PromptSegment
from engine.window import (
    QuantizedWindowKVCache,
    WindowKVCache,
    WindowPolicy,
    make_window_cache,
    restore_window_cache,
    set_dense_from,
)


def tiny_llama(seed: int = 0) -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
        vocab_size=256, max_position_embeddings=4096,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def prefill(model, tokens: mx.array, caches, step: int = 64) -> mx.array:
    outs = [model(tokens[:, s:s + step], cache=caches) for s in range(0, tokens.shape[1], step)]
    return mx.concatenate(outs, axis=1)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def tokens():
    mx.random.seed(1)
    return mx.random.randint(0, 256, (1, 300))


# --- which keys each query sees, read off the real fused attention -----------------

def attended(cache: WindowKVCache, start: int, n: int) -> list[set[int]]:
    """Absolute key positions each query of chunk [start, start+n) attends to.

    Prefills [0, start) first, then runs the chunk through the fused kernel with
    zero queries (uniform attention over allowed keys) and one-hot values, so the
    non-zero output entries are exactly the allowed key positions.
    """
    dim = 64

    def onehot(lo: int, hi: int) -> mx.array:
        return mx.eye(dim)[lo:hi][None, None]

    if start:
        cache.update_and_fetch(mx.zeros((1, 1, start, dim)), onehot(0, start))
    mask = cache.make_mask(n)
    keys, values = cache.update_and_fetch(mx.zeros((1, 1, n, dim)), onehot(start, start + n))
    out = mx.fast.scaled_dot_product_attention(mx.zeros((1, 1, n, dim)), keys, values, scale=1.0, mask=mask)
    rows = out[0, 0].tolist()
    return [{k for k, w in enumerate(row) if w > 1e-6} for row in rows]


@pytest.mark.parametrize(
    "form, start, dense_from, expected",
    [
        # G=2, W=3, chunk [6, 8): block form sees [0,2) + [3,6) + the chunk causally.
        ("block", 6, 100, [{0, 1, 3, 4, 5, 6}, {0, 1, 3, 4, 5, 6, 7}]),
        # Per-query form: each query sees [0,2) + [q-3, q].
        ("query", 6, 100, [{0, 1, 3, 4, 5, 6}, {0, 1, 4, 5, 6, 7}]),
        # Chunk crossing dense_from: block form goes dense for the whole chunk ...
        ("block", 6, 7, [{0, 1, 2, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 5, 6, 7}]),
        # ... the per-query form only for the queries at or after dense_from.
        ("query", 6, 7, [{0, 1, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 5, 6, 7}]),
        # Window reaching back to G leaves no gap: dense.
        ("block", 5, 100, [{0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5, 6}]),
    ],
)
def test_masks_match_hand_computed_sets(form, start, dense_from, expected):
    cache = WindowKVCache(WindowPolicy(global_tokens=2, window_tokens=3, form=form), dense_from=dense_from)
    assert attended(cache, start, 2) == expected


def test_block_form_returns_contiguous_keys_with_causal_string_mask():
    cache = WindowKVCache(WindowPolicy(global_tokens=4, window_tokens=8), dense_from=1000)
    cache.update_and_fetch(mx.zeros((1, 2, 64, 64)), mx.zeros((1, 2, 64, 64)))
    assert cache.make_mask(16) == "causal"
    keys, _ = cache.update_and_fetch(mx.zeros((1, 2, 16, 64)), mx.zeros((1, 2, 16, 64)))
    assert keys.shape[2] == 4 + 8 + 16
    assert cache.offset == 80


def test_array_mask_agrees_with_string_mask_alignment():
    cache = WindowKVCache(WindowPolicy(global_tokens=2, window_tokens=3), dense_from=100)
    cache.update_and_fetch(mx.zeros((1, 1, 6, 64)), mx.zeros((1, 1, 6, 64)))
    mask = cache.make_mask(2, return_array=True)
    assert mask.tolist() == [[True] * 6 + [False], [True] * 7]


# --- model-level equivalences ------------------------------------------------------

def test_window_covering_the_prompt_equals_dense_exactly(model, tokens):
    dense = prefill(model, tokens, [KVCache() for _ in model.layers])
    caches = make_window_cache(model, WindowPolicy(global_tokens=128, window_tokens=256), 16)
    set_dense_from(caches, 10**9)
    assert mx.array_equal(prefill(model, tokens, caches), dense).item()


def test_disabled_policy_equals_dense_exactly(model, tokens):
    dense = prefill(model, tokens, [KVCache() for _ in model.layers])
    caches = make_window_cache(model, WindowPolicy(enabled=False, global_tokens=8, window_tokens=8), 16)
    set_dense_from(caches, 10**9)
    assert mx.array_equal(prefill(model, tokens, caches), dense).item()


class ExplicitMaskCache(KVCache):
    """Reference: all keys, with the block-window rule written out as a boolean mask."""

    def __init__(self, g: int, w: int, dense_from: int):
        super().__init__()
        self.g, self.w, self.dense_from = g, w, dense_from

    def make_mask(self, N, return_array=False, window_size=None):
        start = self.offset
        q = mx.arange(start, start + N)[:, None]
        k = mx.arange(start + N)[None]
        windowed = start + N <= self.dense_from and start - self.w > self.g
        if not windowed:
            return k <= q
        return (k <= q) & ((k < self.g) | (k >= start - self.w))


def test_block_window_equals_explicit_mask_reference(model, tokens):
    g, w, dense_from = 16, 32, 256
    caches = make_window_cache(model, WindowPolicy(global_tokens=g, window_tokens=w), 16)
    set_dense_from(caches, dense_from)
    windowed = prefill(model, tokens, caches)
    reference = prefill(model, tokens, [ExplicitMaskCache(g, w, dense_from) for _ in model.layers])
    dense = prefill(model, tokens, [KVCache() for _ in model.layers])
    assert mx.allclose(windowed, reference, atol=1e-4).item()
    # Windowing really changed the computation after G+W, and not before.
    assert mx.abs(windowed - dense)[:, 128:].max().item() > 1e-2
    assert mx.array_equal(windowed[:, :64], dense[:, :64]).item()


def test_trim_then_refill_matches_one_pass(model, tokens):
    policy = WindowPolicy(global_tokens=16, window_tokens=32)
    once = make_window_cache(model, policy, 16)
    set_dense_from(once, 256)
    full = prefill(model, tokens, once)

    caches = make_window_cache(model, policy, 16)
    set_dense_from(caches, 256)
    prefill(model, tokens[:, :256], caches)
    assert [c.trim(64) for c in caches] == [64, 64]
    assert all(c.offset == 192 for c in caches)
    again = prefill(model, tokens[:, 192:], caches)
    assert mx.allclose(again, full[:, 192:], atol=1e-5).item()
    assert caches[0].trim(10**6) == 300  # trim is clamped like KVCache.trim


def test_state_round_trip_continues_identically(model, tokens):
    policy = WindowPolicy(global_tokens=16, window_tokens=32, form="query")
    for kv_bits in (16, 8):
        caches = make_window_cache(model, policy, kv_bits)
        set_dense_from(caches, 200)
        prefill(model, tokens[:, :192], caches)
        restored = [restore_window_cache(c.state, c.meta_state) for c in caches]
        assert restored[0].offset == 192 and restored[0].policy == policy and restored[0].dense_from == 200
        a = prefill(model, tokens[:, 192:], caches)
        b = prefill(model, tokens[:, 192:], restored)
        assert mx.array_equal(a, b).item()


def test_factory_kinds_and_validation(model):
    assert all(type(c) is WindowKVCache for c in make_window_cache(model, WindowPolicy(), 16))
    assert all(type(c) is QuantizedWindowKVCache for c in make_window_cache(model, WindowPolicy(), 8))
    with pytest.raises(ValueError, match="kv_bits"):
        make_window_cache(model, WindowPolicy(), 4)
    with pytest.raises(ValueError, match="form"):
        WindowPolicy(form="diagonal")


def test_factory_keeps_recurrent_caches_of_hybrid_models():
    from mlx_lm.models import qwen3_next
    from mlx_lm.models.cache import ArraysCache

    args = qwen3_next.ModelArgs(
        model_type="qwen3_next", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6,
        vocab_size=128, max_position_embeddings=1024, rope_theta=10000.0, partial_rotary_factor=0.25,
        linear_num_value_heads=2, linear_num_key_heads=1, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, num_experts=0, num_experts_per_tok=1, decoder_sparse_step=1,
        shared_expert_intermediate_size=128, moe_intermediate_size=64, mlp_only_layers=[0, 1, 2, 3],
        full_attention_interval=2, tie_word_embeddings=False,
    )
    model = qwen3_next.Model(args)
    caches = make_window_cache(model, WindowPolicy(global_tokens=8, window_tokens=8), 8)
    kinds = [type(c) for c in caches]
    assert kinds.count(ArraysCache) == 2 and kinds.count(QuantizedWindowKVCache) == 2
    set_dense_from(caches, 40)
    out = prefill(model, mx.arange(64)[None] % 128, caches, step=16)
    assert out.shape == (1, 64, 128) and caches[1].offset == 64


# --- layout -> dense_from ----------------------------------------------------------

def seg(kind: str, n: int) -> PromptSegment:
    return PromptSegment(kind=kind, key=kind, token_ids=tuple(range(n)))


def test_dense_from_follows_the_segment_layout():
    policy = WindowPolicy(dense_tail=100, continuation_tail=10)
    layout = [seg("system", 50), seg("file", 500), seg("file", 300), seg("hot", 40), seg("question", 20)]
    assert policy.dense_from(layout) == 750
    # The question does not move dense_from; the stable layout does.
    assert policy.dense_from(layout[:4] + [seg("question", 900)]) == 750
    assert policy.dense_from([seg("system", 50)]) == 0
    assert policy.dense_from_ids(1000) == 990
    assert WindowPolicy(enabled=False).dense_from(layout) == 0
    assert policy.layout_key(600, 750) == 600 and policy.layout_key(800, 750) == 750


def test_fingerprint_fields_name_the_approximation():
    assert WindowPolicy(enabled=False).fingerprint_fields() == {"approximation": False}
    fields = WindowPolicy().fingerprint_fields()
    assert fields["global_tokens"] == 8192 and fields["window_tokens"] == 8192
    assert fields["dense_tail"] == 2048 and fields["continuation_tail"] == 128


def test_single_token_chunks_follow_the_same_rule():
    cache = WindowKVCache(WindowPolicy(global_tokens=2, window_tokens=3), dense_from=100)
    assert attended(cache, 6, 1) == [{0, 1, 3, 4, 5, 6}]
    dense = WindowKVCache(WindowPolicy(global_tokens=2, window_tokens=3), dense_from=6)
    assert attended(dense, 6, 1) == [{0, 1, 2, 3, 4, 5, 6}]
    assert dense.make_mask(1) is None  # decode: dense, no mask
