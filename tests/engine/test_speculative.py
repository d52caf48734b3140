"""Speculative decoding: greedy identity, the engine's decode loop, the drafters, and the sampled distribution.

A round's rollback, cancellation and limits, and auto mode, are in test_speculative_rounds.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from engine.engine import Engine
from engine.draft_model import DraftModelDrafter, check_vocabulary
from engine.errors import DraftModelMismatchError
from engine.lookup import PromptLookupDrafter
from engine.window import WindowPolicy, make_window_cache, set_dense_from
from engine.request import Metrics, Request, SamplingParams, TokenEvent
from engine.sampling import greedy
from engine.speculative import SpeculativeDecoder
from engine.speculative_decode import make_decoder, speculative_decode
import engine.speculative as speculative

from tiny_models import corpus
from spec_helpers import (ScriptedDrafter, chi2_pvalue, decode, plain_greedy, prefill, prompts, tiny_hybrid,
                          tiny_llama)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


# ---- greedy identity -------------------------------------------------------


@pytest.mark.parametrize("n_new", [1, 17, 64])
def test_lookup_greedy_output_equals_plain_decoding(target, n_new):
    drafted = accepted = 0
    for prompt in prompts():
        reference = plain_greedy(target, prompt, n_new)
        dec = make_decoder("lookup", target, prefill(target, prompt), prompt)
        assert decode(dec, n_new) == reference, f"prompt {prompt[:8]}..."
        drafted, accepted = drafted + dec.stats.drafted, accepted + dec.stats.accepted
    if n_new > 1:
        # The identity must have been tested through both outcomes of a round.
        assert 0 < accepted < drafted


def test_draft_model_greedy_output_equals_plain_decoding(target):
    weak = tiny_llama(seed=1)
    for draft_model, expect_all in ((target, True), (weak, False)):
        for prompt in prompts(count=6):
            reference = plain_greedy(target, prompt, 40)
            dec = make_decoder("draft", target, prefill(target, prompt), prompt,
                               draft=DraftModelDrafter(draft_model, k=4))
            assert decode(dec, 40) == reference
            assert dec.stats.drafted > 0
            assert (dec.stats.accepted == dec.stats.drafted) == expect_all
            if expect_all:
                assert dec.stats.tokens_per_forward > 4.0


def test_quantized_kv_cache_greedy_identity():
    target = tiny_llama(seed=2, hidden=128)  # head_dim 32: a supported quantization group

    def q8_cache():
        return [QuantizedKVCache(group_size=32, bits=8) for _ in target.layers]

    for prompt in prompts(count=6):
        reference = plain_greedy(target, prompt, 48, cache=q8_cache())
        dec = make_decoder("lookup", target, prefill(target, prompt, q8_cache()), prompt)
        assert decode(dec, 48) == reference


def plain_loop(model, cache, history, n):
    """One token per forward, argmax: the plain decode over any cache."""
    out, last = [], history[-1]
    for _ in range(n):
        logits = model(mx.array([[last]], dtype=mx.uint32), cache=cache)
        last = int(mx.argmax(logits[0, -1]).item())
        out.append(last)
    return out


def chunked_prefill(model, cache, prompt, chunk=16):
    for start in range(0, len(prompt) - 1, chunk):
        model(mx.array([prompt[start : min(start + chunk, len(prompt) - 1)]], dtype=mx.uint32), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_window_policy_caches_greedy_identity(kv_bits):
    target = tiny_llama(seed=2, hidden=128)
    policy = WindowPolicy(global_tokens=8, window_tokens=16, dense_tail=0, continuation_tail=8)

    def window_cache(prompt):
        cache = make_window_cache(target, policy, kv_bits=kv_bits, group_size=32)
        set_dense_from(cache, policy.dense_from_ids(len(prompt)))
        return chunked_prefill(target, cache, prompt)

    long_prompts = [p for p in prompts() if len(p) >= 60]
    drafted = 0
    for prompt in long_prompts:
        reference = plain_loop(target, window_cache(prompt), prompt, 40)
        dec = make_decoder("lookup", target, window_cache(prompt), prompt)
        assert decode(dec, 40) == reference
        drafted += dec.stats.drafted
    assert drafted > 0


def test_hybrid_model_rolls_back_recurrent_state_by_snapshot():
    model = tiny_hybrid(seed=3)
    assert any(not c.is_trimmable() for c in make_prompt_cache(model))
    reruns = 0
    for prompt in prompts(count=6):
        reference = plain_greedy(model, prompt, 32)
        dec = make_decoder("lookup", model, prefill(model, prompt), prompt)
        assert decode(dec, 32) == reference
        reruns += dec.stats.reruns
    # Partial acceptance happened, so the snapshot-and-re-run path was exercised.
    assert reruns > 0


# ---- the engine's decode loop --------------------------------------------------


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_engine_speculation_modes_stream_the_plain_greedy_output(tiny_loaded, kv_bits):
    ids = tiny_loaded.tokenizer.encode(corpus()[:2000])[:240]
    ids = ids + ids[:120]
    # The model drafting for itself: every draft is right, so every round drafts.
    modes = {"off": None, "lookup": None, "auto": None,
             "draft": DraftModelDrafter(tiny_loaded.model, k=3)}
    runs = {}
    for mode, draft in modes.items():
        engine = Engine(tiny_loaded, kv_bits=kv_bits, prefill_chunk=64, speculation=mode, draft=draft)
        try:
            events = list(engine.submit(Request(prompt_ids=ids, max_tokens=48)))
        finally:
            engine.close()
        tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
        runs[mode] = (tokens, events[-1])
    off_tokens, off_done = runs["off"]
    assert len(off_tokens) > 8 and off_done.metrics.drafted_tokens == 0
    for mode in ("lookup", "auto", "draft"):
        tokens, done = runs[mode]
        assert tokens == off_tokens and done.text == off_done.text, mode
        assert done.finish_reason == off_done.finish_reason
    drafted = runs["draft"][1].metrics
    assert drafted.drafted_tokens >= 30 and drafted.accepted_tokens == drafted.drafted_tokens


def test_speculative_decode_stops_at_eos_inside_an_accepted_round(target):
    prompt = prompts()[1]
    reference = plain_greedy(target, prompt, 30)
    eos = reference[9]
    cut = reference.index(eos)
    cache = make_prompt_cache(target)
    logits = target(mx.array([prompt], dtype=mx.uint32), cache=cache)[:, -1, :]
    metrics = Metrics()
    drafter = ScriptedDrafter(reference, len(prompt), k=8, wrong_at=99)
    out = list(speculative_decode(target, cache, logits, greedy, 30, {eos}, prompt_ids=prompt,
                                  mode="draft", draft=drafter, metrics=metrics))
    assert out == reference[:cut]
    assert metrics.drafted_tokens > 0 and metrics.accepted_tokens == metrics.drafted_tokens


# ---- prompt lookup -------------------------------------------------------------


def test_lookup_drafts_what_followed_the_longest_most_recent_match():
    d = PromptLookupDrafter(max_ngram=3, min_ngram=1, k_start=3)
    #            0  1  2  3  4  5  6  7  8  9
    history = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 4, 5, 6, 7]
    # Suffix [5, 6, 7] occurred at 0..2 (followed by 8, 9, 1); [6, 7] more recently at 6..7
    # (followed by 2) but the longer match wins.
    assert d.draft(history) == [8, 9, 1]
    assert d.draft(history + [42]) == []  # 42 never occurred before
    d.observe(drafted=3, accepted=3)
    assert d.k == 5
    d.observe(drafted=5, accepted=1)
    assert d.k == 2
    # A history that is not an extension of the last one rebuilds the index.
    assert d.draft([1, 2, 3, 1, 2]) == [3, 1]


# ---- draft model vocabulary -------------------------------------------------------


def word_tokenizer(words: list[str]) -> Tokenizer:
    return Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))


def test_vocabulary_check_names_the_difference():
    check_vocabulary(word_tokenizer(["<unk>", "a", "b"]), word_tokenizer(["<unk>", "a", "b"]))
    with pytest.raises(DraftModelMismatchError, match="different ids: 'a' 1 vs 2") as info:
        check_vocabulary(word_tokenizer(["<unk>", "a", "b"]), word_tokenizer(["<unk>", "b", "a", "c"]))
    assert "only in the draft: ['c']" in str(info.value)


# ---- the sampled distribution ----------------------------------------------------------


VOCAB = 8


def exact_two_token_distribution(model, prompt) -> np.ndarray:
    """p(t1, t2) = p(t1) p(t2 | t1) at temperature 1, from plain forwards."""
    def probs(history):
        logits = model(mx.array([history], dtype=mx.uint32))[0, -1]
        return np.array(mx.softmax(logits.astype(mx.float32)), dtype=np.float64)

    first = probs(prompt)
    return np.stack([first[a] * probs(prompt + [a]) for a in range(VOCAB)])


def sampled_two_token_counts(model, prompt, drafts, samples: int, seed: int) -> np.ndarray:
    counts = np.zeros((VOCAB, VOCAB))
    dec = SpeculativeDecoder(model, prefill(model, prompt), prompt, None,
                             SamplingParams(temperature=1.0, seed=seed))

    class Fixed:
        def draft(self, history, k=None):
            return list(drafts)

        def observe(self, drafted, accepted):
            pass

    dec.drafter = Fixed()
    for _ in range(samples):
        out = dec.step()
        if len(out) < 2:
            out += dec.step()
        counts[out[0], out[1]] += 1
        # Rewind to the prompt for the next sample.
        for c in dec.cache:
            c.trim(len(dec.history) - len(prompt))
        dec.history = list(prompt)
    return counts


def chi_square(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """Pearson's p-value, cells expecting fewer than 5 draws pooled into one."""
    expected = expected_p * counts.sum()
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    stat = float(((observed - expected) ** 2 / expected).sum())
    return chi2_pvalue(stat, len(expected) - 1)


@pytest.fixture(scope="module")
def small_vocab_model():
    return tiny_llama(seed=11, vocab=VOCAB, scale=1.0)


def test_rejection_sampling_preserves_the_target_distribution(small_vocab_model):
    prompt = [1, 2, 3, 4, 5, 6, 7, 0]
    exact = exact_two_token_distribution(small_vocab_model, prompt)
    top = np.unravel_index(exact.argmax(), exact.shape)
    # Drafting the most likely pair makes every kind of round happen often.
    counts = sampled_two_token_counts(small_vocab_model, prompt, [int(top[0]), int(top[1])], 2000, 1)
    assert chi_square(counts, exact) > 0.01


def test_distribution_test_catches_a_wrong_residual(small_vocab_model, monkeypatch):
    # Sampling from p itself after a rejection (instead of p without the draft)
    # over-produces the draft token; the test above must be able to see that.
    monkeypatch.setattr(speculative, "residual", lambda p, rejected: p)
    prompt = [1, 2, 3, 4, 5, 6, 7, 0]
    exact = exact_two_token_distribution(small_vocab_model, prompt)
    top = np.unravel_index(exact.argmax(), exact.shape)
    counts = sampled_two_token_counts(small_vocab_model, prompt, [int(top[0]), int(top[1])], 600, 1)
    assert chi_square(counts, exact) < 1e-6


def test_top_p_sampling_only_draws_from_the_nucleus(small_vocab_model):
    prompt = [1, 2, 3, 4, 5, 6, 7, 0]
    logits = small_vocab_model(mx.array([prompt], dtype=mx.uint32))[0]
    p = speculative.target_probs(logits[-1:], SamplingParams(temperature=1.0, top_p=0.5))[0]
    full = speculative.target_probs(logits[-1:], SamplingParams(temperature=1.0))[0]
    kept = np.flatnonzero(p)
    order = np.argsort(-full)
    assert set(kept) == set(order[: len(kept)])
    assert full[order[: len(kept) - 1]].sum() < 0.5 <= full[order[: len(kept)]].sum()
    np.testing.assert_allclose(p[kept], full[kept] / full[kept].sum())
