"""Windowed prefill as the engine's live cache: layout, identity, warm == cold, policy switches.

The tiny layout is [system][5 files] (220 tokens) + question + header, prefilled
in chunks of 16 with G = 16, W = 32 and a dense tail of 16: the chunks from 64
to 192 really are windowed (a test below shows the logits change), and
everything after the stable files is dense.
"""
from __future__ import annotations

import mlx.core as mx
import pytest

from checkpoint_helpers import ask, cold, edit, prefix_len, repo_segments, run
from engine.engine import Engine
from engine.policy import CachePolicy
from engine.prefix_cache import PrefixCache
from engine.request import Metrics, Request
from engine.window import QuantizedWindowKVCache, WindowKVCache, WindowPolicy, make_window_cache
from tiny_models import build_tiny_model

WINDOW = WindowPolicy(global_tokens=16, window_tokens=32, dense_tail=16, continuation_tail=8)
ARCHIVE_BYTES = 64 << 20


@pytest.fixture(scope="module")
def repo(tiny_loaded):
    return repo_segments(tiny_loaded.tokenizer)


def _prefill_logits(loaded, segments, window: WindowPolicy | None) -> mx.array:
    """Last logits of a cold prefill through `PrefixCache` (window caches when `window`)."""
    policy = CachePolicy("tiny", "w", "float32", prefill_chunk=16)
    cache = make_window_cache(loaded.model, window) if window is not None else None
    prefix = PrefixCache(loaded.model, policy, budget_bytes=1 << 30, cache=cache, window=window)
    return prefix.prefill(Request(segments=segments, max_tokens=1), 16, lambda: False, Metrics())


def test_window_changes_the_logits_and_a_covering_window_equals_dense_exactly(tiny_loaded, repo):
    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    dense = _prefill_logits(tiny_loaded, layout, None)
    windowed = _prefill_logits(tiny_loaded, layout, WINDOW)
    covering = _prefill_logits(tiny_loaded, layout, WindowPolicy(global_tokens=4096, window_tokens=4096))
    assert not mx.allclose(dense, windowed, atol=1e-4).item()
    assert mx.array_equal(dense, covering).item()


def test_dense_from_follows_each_request_layout(tiny_loaded, repo):
    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    ids = tiny_loaded.tokenizer.encode("a plain prompt " * 20)
    with Engine(tiny_loaded, prefill_chunk=16, window=WINDOW) as eng:
        run(eng, layout)
        caches = [c for c in eng.prefix.cache if isinstance(c, WindowKVCache)]
        assert caches and {c.dense_from for c in caches} == {prefix_len(repo, len(repo)) - 16}
        list(eng.submit(Request(prompt_ids=ids, max_tokens=1)))
        assert {c.dense_from for c in caches} == {len(ids) - 8}


def test_warm_equals_cold_with_the_window_on(tiny_loaded, repo):
    tok = tiny_loaded.tokenizer
    requests = [
        ask(tok, repo, "Where is main?"),
        ask(tok, repo, "What does f2 do?"),                                    # follow-up question
        ask(tok, edit(repo, 3, tuple(tok.encode("def changed():\n    return 42\n"))), "What changed?"),
        ask(tok, edit(repo, 5, tuple(tok.encode("x = 1\n"))), "What changed?"),  # last file edited
        ask(tok, repo, "And then?", turns=("Where is main?", "In f0.")),       # conversation
    ]
    with Engine(tiny_loaded, prefill_chunk=16, window=WINDOW) as eng:
        restored = []
        for layout in requests:
            tokens, done = run(eng, layout)
            assert tokens == cold(tiny_loaded, layout, window=WINDOW)
            restored.append(done.metrics.cached_tokens)
    assert restored[0] == 0
    assert restored[1] >= prefix_len(repo, len(repo)) - 16   # the whole stable prefix on the grid
    assert 0 < restored[2] <= prefix_len(repo, 3)            # kept up to the edited file


def test_window_with_8bit_kv_is_the_fused_cache_and_warm_equals_cold(tiny_loaded, repo):
    tok = tiny_loaded.tokenizer
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=8, window=WINDOW) as eng:
        assert any(isinstance(c, QuantizedWindowKVCache) for c in eng.prefix.cache)
        for question in ("Where is main?", "What does f2 do?"):
            layout = ask(tok, repo, question)
            tokens, _ = run(eng, layout)
            assert tokens == cold(tiny_loaded, layout, kv_bits=8, window=WINDOW)


def test_8bit_kv_without_window_uses_the_fused_cache(tiny_loaded):
    with Engine(tiny_loaded, kv_bits=8) as eng:
        assert all(type(c) is QuantizedWindowKVCache for c in eng.prefix.cache)
        assert eng.prefix.policy.approximation is False


def test_disabled_window_is_exact_attention_with_the_dense_fingerprint(tiny_loaded, repo):
    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    with Engine(tiny_loaded, prefill_chunk=16) as plain, \
            Engine(tiny_loaded, prefill_chunk=16, window=WindowPolicy(enabled=False)) as off:
        assert off.prefix.policy.fingerprint() == plain.prefix.policy.fingerprint()
        assert run(off, layout)[0] == run(plain, layout)[0]


def test_fingerprint_covers_g_w_tails_form_bits_and_approximation():
    def fp(window, kv_bits=16):
        fields = window.cache_policy_fields() if window is not None and window.enabled else {}
        return CachePolicy("m", "w", "float32", kv_bits=kv_bits, **fields).fingerprint()

    variants = [WINDOW, WindowPolicy(32, 32, 16, 8), WindowPolicy(16, 64, 16, 8),
                WindowPolicy(16, 32, 32, 8), WindowPolicy(16, 32, 16, 16),
                WindowPolicy(16, 32, 16, 8, form="query")]
    prints = [fp(w) for w in variants] + [fp(None), fp(WINDOW, kv_bits=8)]
    assert len(set(prints)) == len(prints)
    assert fp(WindowPolicy(enabled=False)) == fp(None)


def test_policy_switch_in_the_engine_is_a_policy_mismatch(tiny_loaded, repo):
    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    with Engine(tiny_loaded, prefill_chunk=16, window=WINDOW) as eng:
        run(eng, layout)
        assert run(eng, layout)[1].metrics.cached_tokens > 0
        eng.set_window(None)
        tokens, done = run(eng, layout)
        assert done.metrics.cached_tokens == 0 and done.metrics.miss_reason == "policy mismatch"
        assert tokens == cold(tiny_loaded, layout)
        assert eng.stats()["cache"]["approximation"] is False
        eng.set_window(WINDOW)
        tokens, done = run(eng, layout)
        assert done.metrics.miss_reason == "policy mismatch"
        assert tokens == cold(tiny_loaded, layout, window=WINDOW)


def test_policy_switch_through_the_archive_is_a_policy_mismatch(tmp_path, monkeypatch, tiny_loaded, repo):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    with Engine(tiny_loaded, prefill_chunk=16, window=WINDOW, archive_bytes=ARCHIVE_BYTES) as first:
        run(first, layout)
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as exact:
        _, done = run(exact, layout)
    assert done.metrics.cached_tokens == 0 and done.metrics.miss_reason == "policy mismatch"
    with Engine(tiny_loaded, prefill_chunk=16, window=WINDOW, archive_bytes=ARCHIVE_BYTES) as again:
        tokens, done = run(again, layout)
    assert done.metrics.cached_tokens == prefix_len(layout, len(layout) - 2)
    assert tokens == cold(tiny_loaded, layout, window=WINDOW)


def test_hybrid_model_warm_equals_cold_with_the_window_on(tmp_path_factory):
    from engine.loading import load_model

    hybrid = load_model(str(build_tiny_model(tmp_path_factory.mktemp("hybrid-window"), "qwen3_next")),
                        progress=False)
    repo = repo_segments(hybrid.tokenizer, n_files=5, file_tokens=40)
    window = WindowPolicy(global_tokens=16, window_tokens=32, dense_tail=16)
    with Engine(hybrid, prefill_chunk=16, window=window) as eng:
        for question in ("Where is main?", "What does f2 do?"):
            layout = ask(hybrid.tokenizer, repo, question)
            tokens, _ = run(eng, layout)
            assert tokens == cold(hybrid, layout, window=window)


def test_speculative_decoding_over_the_window_cache_gives_the_same_tokens(tiny_loaded, repo):
    from engine.draft_model import DraftModelDrafter

    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    # The model drafting for itself: every round drafts, so verification runs on the window cache.
    drafter = DraftModelDrafter(tiny_loaded.model, k=3)
    with Engine(tiny_loaded, prefill_chunk=16, window=WINDOW, speculation="draft", draft=drafter) as eng:
        tokens, done = run(eng, layout, max_tokens=24)
    assert done.metrics.drafted_tokens > 0
    assert tokens == cold(tiny_loaded, layout, max_tokens=24, window=WINDOW)
