"""The draft model: its own checkpointed cache (reuse across requests, rollback, cancel mid-round),
and the drafter the `model.draftModel` setting builds."""
from __future__ import annotations

import pytest

from engine.draft_model import DraftModelDrafter, drafter_for
from engine.engine import Engine
from engine.errors import DraftModelMismatchError, ModelLoadError, RequestCancelled
from engine.request import Metrics, PromptSegment, Request, TokenEvent

from spec_helpers import plain_greedy, tiny_llama
from tiny_models import build_tiny_model, corpus


def layout(tokenizer, question: str) -> list[PromptSegment]:
    """[system][file][file][question][header]: the prefix is the first three segments."""
    text = corpus()
    enc = tokenizer.encode
    return [
        PromptSegment("system", "", tuple(enc("You answer questions about code.")), protected=True),
        PromptSegment("file", "a.py", tuple(enc(text[:700]))),
        PromptSegment("file", "b.py", tuple(enc(text[:400]))),  # repeats a.py: lookup drafts hit
        PromptSegment("question", "", tuple(enc(question))),
        PromptSegment("header", "", tuple(enc("Answer:"))),
    ]


def run(engine: Engine, segments: list[PromptSegment], max_tokens: int = 40):
    events = list(engine.submit(Request(segments=segments, max_tokens=max_tokens)))
    tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
    return tokens, events[-1]


@pytest.fixture(scope="module")
def questions(tiny_loaded):
    tok = tiny_loaded.tokenizer
    return [layout(tok, "What does greet return?"), layout(tok, "Where is the name used?")]


@pytest.fixture(scope="module")
def reference(tiny_loaded, questions):
    engine = Engine(tiny_loaded, prefill_chunk=64)
    try:
        return [run(engine, q)[0] for q in questions]
    finally:
        engine.close()


def test_second_request_restores_the_draft_prefix_and_keeps_greedy_output(
        tiny_loaded, questions, reference):
    prefix_len = sum(len(s.token_ids) for s in questions[0][:3])
    draft = DraftModelDrafter(tiny_loaded.model, k=3, prefill_step=64)
    engine = Engine(tiny_loaded, prefill_chunk=64, speculation="draft", draft=draft)
    try:
        first_tokens, first = run(engine, questions[0])
        second_tokens, second = run(engine, questions[1])
    finally:
        engine.close()
    assert [first_tokens, second_tokens] == reference
    assert first.metrics.draft_cached_tokens == 0
    assert first.metrics.draft_recomputed_tokens == first.metrics.prompt_tokens
    # The second request prefills only its question and header in the draft model.
    assert second.metrics.draft_cached_tokens == prefix_len
    assert second.metrics.draft_recomputed_tokens == second.metrics.prompt_tokens - prefix_len
    assert second.metrics.drafted_tokens > 0


class CancellingDrafter:
    """A draft model that cancels its request from inside its `n`-th draft (mid-round)."""

    def __init__(self, inner: DraftModelDrafter, engine_ref: list, n: int):
        self.inner, self.engine_ref, self.n, self.calls = inner, engine_ref, n, 0
        self.request_id: str | None = None

    def prefill_request(self, request, should_cancel, metrics=None):
        self.request_id = request.request_id
        self.inner.prefill_request(request, should_cancel, metrics)

    def draft(self, history, k=None):
        self.calls += 1
        drafts = self.inner.draft(history, k)
        if self.calls == self.n:
            self.engine_ref[0].cancel(self.request_id)
        return drafts

    def observe(self, drafted, accepted):
        self.inner.observe(drafted, accepted)


def test_cancel_mid_round_rolls_back_both_caches(tiny_loaded, questions, reference):
    inner = DraftModelDrafter(tiny_loaded.model, k=3, prefill_step=64)
    engine_ref: list = []
    drafter = CancellingDrafter(inner, engine_ref, n=4)
    engine = Engine(tiny_loaded, prefill_chunk=64, speculation="draft", draft=drafter)
    engine_ref.append(engine)
    try:
        cancelled_tokens, cancelled = run(engine, questions[0])
        again_tokens, again = run(engine, questions[0])
        other_tokens, _ = run(engine, questions[1])
    finally:
        engine.close()
    assert cancelled.finish_reason == "cancelled"
    # Three full rounds were emitted before the fourth was cancelled after drafting.
    assert 3 <= len(cancelled_tokens) < len(reference[0])
    assert cancelled_tokens == reference[0][: len(cancelled_tokens)]
    assert again_tokens == reference[0] and other_tokens == reference[1]
    # The draft model's confirmed prefix (up to the question's end) survived the cancel.
    assert again.metrics.draft_cached_tokens > 0
    assert again.metrics.draft_recomputed_tokens == (again.metrics.prompt_tokens
                                                     - again.metrics.draft_cached_tokens)


def test_cancelled_draft_prefill_keeps_only_confirmed_checkpoints(tiny_loaded, questions):
    draft = DraftModelDrafter(tiny_loaded.model, k=4, prefill_step=32)
    request = Request(segments=questions[0])
    ids = request.all_token_ids()
    polls = []

    def stop_after_three_chunks() -> bool:
        polls.append(1)
        return len(polls) > 3

    with pytest.raises(RequestCancelled):
        draft.prefill_request(request, stop_after_three_chunks)
    kept = draft.prefix.store.line_offset
    assert 0 < kept <= 3 * 32
    assert [c.offset for c in draft.cache] == [kept] * len(draft.cache)
    metrics = Metrics()
    draft.prefill_request(request, lambda: False, metrics)
    assert (metrics.draft_cached_tokens, metrics.draft_recomputed_tokens) == (kept, len(ids) - kept)
    # Drafts from the restored cache are the draft model's plain greedy continuation.
    assert draft.draft(ids) == plain_greedy(tiny_loaded.model, ids, 4)


def test_unrelated_history_leaves_the_line_and_the_prefix_stays_restorable():
    model = tiny_llama(seed=5)
    draft = DraftModelDrafter(model, k=4, prefill_step=16)
    segments = [PromptSegment("file", "a", tuple(range(10, 60))),
                PromptSegment("question", "", tuple(range(70, 80))),
                PromptSegment("header", "", (3, 4))]
    request = Request(segments=segments)
    ids = request.all_token_ids()
    draft.prefill_request(request, lambda: False)
    assert draft.draft(ids) == plain_greedy(model, ids, 4)
    unrelated = [200, 201, 202, 203, 204, 205]
    assert draft.draft(unrelated) == plain_greedy(model, unrelated, 4)
    metrics = Metrics()
    draft.prefill_request(request, lambda: False, metrics)
    assert metrics.draft_cached_tokens == 50  # the detached file came back as a branch (the question joins the header)
    assert draft.draft(ids) == plain_greedy(model, ids, 4)


def test_drafter_for_loads_the_named_model_like_the_target(tiny_loaded, tiny_model_dir, questions, reference,
                                                           tmp_path):
    draft = drafter_for(str(tiny_model_dir), "draft", tiny_loaded.tokenizer, k=3, prefill_step=64)
    assert draft.model is not tiny_loaded.model  # its own copy, through the loader
    assert (draft.prefix.policy.model_id, draft.prefix.policy.weight_hash) == (tiny_loaded.model_id,
                                                                               tiny_loaded.weight_hash)
    assert draft.prefix.policy.compute == draft.compute.identity()
    engine = Engine(tiny_loaded, prefill_chunk=64, speculation="draft", draft=draft)
    try:
        tokens, done = run(engine, questions[0])
    finally:
        engine.close()
    assert tokens == reference[0] and done.metrics.drafted_tokens > 0
    assert drafter_for("", "auto", tiny_loaded.tokenizer) is None
    assert drafter_for(str(tiny_model_dir), "lookup", tiny_loaded.tokenizer) is None
    other = build_tiny_model(tmp_path / "other-vocab", "llama", vocab_size=300)
    with pytest.raises(DraftModelMismatchError, match="tokenizer differs"):
        drafter_for(str(other), "auto", tiny_loaded.tokenizer)


def test_draft_mode_needs_a_draft_model(tiny_loaded):
    with pytest.raises(ModelLoadError, match="model.draftModel"):
        drafter_for("", "draft", tiny_loaded.tokenizer)
    with pytest.raises(ValueError, match="needs a draft model"):
        Engine(tiny_loaded, speculation="draft")
