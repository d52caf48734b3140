"""Periodic checkpoints during a long generation: recorded on the grid, restored by a
continuation (logits within float tolerance of a cold prefill), the rollback target of a cancel."""
from __future__ import annotations

import mlx.core as mx
import pytest

from checkpoint_helpers import ask, cold, prefix_len, repo_segments, run
from engine import state
from engine.engine import Engine
from engine.generate import decode
from engine.loading import load_model
from engine.policy import CachePolicy
from engine.prefix_cache import PrefixCache
from engine.request import Metrics, PromptSegment, Request, SamplingParams, TokenEvent
from engine.sampling import make_sampler
from tiny_models import build_tiny_model

CHUNK = 16


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return load_model(str(build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-next"), "qwen3_next")),
                      progress=False)


def _answer(ids) -> PromptSegment:
    return PromptSegment("answer", "answer", tuple(ids))


def _generate(prefix: PrefixCache, segments, n_tokens: int) -> list[int]:
    """Prefill + greedy decode of `n_tokens` (no EOS stop), recording as the engine does."""
    logits = prefix.prefill(Request(segments=segments), CHUNK, lambda: False, Metrics())
    generated: list[int] = []
    for token in decode(prefix.model, prefix.cache, logits, make_sampler(SamplingParams()), n_tokens):
        generated.append(token)
        prefix.record_decoded(generated)
    return generated


@pytest.mark.parametrize("which", ["dense", "hybrid"])
def test_continuation_restores_the_periodic_checkpoints(tiny_loaded, hybrid, which):
    loaded = tiny_loaded if which == "dense" else hybrid
    model, tok = loaded.model, loaded.tokenizer
    segments = ask(tok, repo_segments(tok), "Write a lot.")
    n = prefix_len(segments, len(segments))
    policy = CachePolicy("tiny", which, "float32", prefill_chunk=CHUNK)
    warm = PrefixCache(model, policy, budget_bytes=1 << 30)
    generated = _generate(warm, segments, 2 * CHUNK + 8)
    answers = [c for c in warm.store.checkpoints() if c.boundary.kind == "answer"]
    assert [(c.boundary.end, c.boundary.protected) for c in answers] == [(n + CHUNK, True), (n + 2 * CHUNK, True)]
    assert all(c.kv is None for c in answers)  # offset marks on the live line
    assert all(bool(c.recurrent) == (which == "hybrid") for c in answers)  # snapshots for recurrent layers

    follow = [*segments, _answer(generated), PromptSegment("question", "q2", tuple(tok.encode("More?")))]
    metrics = Metrics()
    warm_logits = warm.prefill(Request(segments=follow), CHUNK, lambda: False, metrics)
    assert metrics.cached_tokens == n + 2 * CHUNK and metrics.miss_reason == "new prefix"  # the rest is new
    cold_cache = PrefixCache(model, policy, budget_bytes=1 << 30)
    cold_logits = cold_cache.prefill(Request(segments=follow), CHUNK, lambda: False, Metrics())
    # Decode built the restored state one token at a time, the cold run in chunks: equal to float tolerance.
    assert mx.allclose(warm_logits, cold_logits, atol=1e-4).item()
    assert mx.argmax(warm_logits).item() == mx.argmax(cold_logits).item()


def test_a_short_answer_records_nothing(tiny_loaded):
    tok = tiny_loaded.tokenizer
    segments = ask(tok, repo_segments(tok), "Short.")
    prefix = PrefixCache(tiny_loaded.model, CachePolicy("tiny", "w", "float32", prefill_chunk=CHUNK),
                         budget_bytes=1 << 30)
    _generate(prefix, segments, CHUNK - 1)
    assert not [c for c in prefix.store.checkpoints() if c.boundary.kind == "answer"]


def test_cancel_during_a_long_answer_rolls_back_to_its_last_checkpoint(tiny_loaded):
    tok = tiny_loaded.tokenizer
    repo = repo_segments(tok)
    segments = ask(tok, repo, "Talk a lot")
    n = prefix_len(segments, len(segments))
    with Engine(tiny_loaded, prefill_chunk=CHUNK) as engine:
        handle = engine.submit(Request(segments=segments, max_tokens=500))
        received: list[int] = []
        for event in handle:
            if isinstance(event, TokenEvent):
                received.extend(event.token_ids)
                if len(received) >= 2 * CHUNK + 4:
                    handle.cancel()
        assert event.finish_reason == "cancelled"
        kept = engine.prefix.store.line_offset
        assert state.attention_offset(engine.prefix.cache) == kept  # unconfirmed tokens dropped
        assert kept >= n + 2 * CHUNK and (kept - n) % CHUNK == 0
        decoded = event.metrics.decode_tokens
        assert kept - n <= decoded
        # The next request is correct, and another question still restores the whole prefix.
        other = ask(tok, repo, "Short")
        tokens, done = run(engine, other)
        assert tokens == cold(tiny_loaded, other)
        assert done.metrics.cached_tokens == prefix_len(other, len(other) - 2)
