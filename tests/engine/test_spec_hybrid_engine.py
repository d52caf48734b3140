"""Speculation through the Engine on a hybrid target (recurrent + attention layers)."""
from __future__ import annotations

import pytest

from engine.draft_model import DraftModelDrafter
from engine.engine import Engine
from engine.errors import DraftModelMismatchError
from engine.loading import load_model
from engine.request import Request, TokenEvent
from tiny_models import build_tiny_model, corpus


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-next-spec"), "qwen3_next")
    return load_model(str(path), progress=False)


def run(engine: Engine, ids: list[int], max_tokens: int = 40):
    events = list(engine.submit(Request(prompt_ids=ids, max_tokens=max_tokens)))
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids], events[-1]


@pytest.fixture(scope="module")
def llama_draft(tmp_path_factory):
    """A tiny llama with the same (deterministically trained) tokenizer as the hybrid."""
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-llama-draft"), "llama", seed=1)
    return load_model(str(path), progress=False)


def test_hybrid_target_speculates_with_the_plain_greedy_output(hybrid, llama_draft):
    ids = hybrid.tokenizer.encode(corpus()[:1200])[:160]
    prompts = [ids + ids[:60], ids + ids[40:90]]  # the second restores the first's prefix
    results = {}
    for mode in ("off", "lookup", "draft"):
        draft = DraftModelDrafter(llama_draft.model, k=3, prefill_step=32) if mode == "draft" else None
        engine = Engine(hybrid, prefill_chunk=32, speculation=mode, draft=draft)
        try:
            results[mode] = [run(engine, p) for p in prompts]
        finally:
            engine.close()
    for mode in ("lookup", "draft"):
        for (tokens, done), (ref, ref_done) in zip(results[mode], results["off"]):
            assert tokens == ref and done.text == ref_done.text, mode
    done = results["draft"][1][1].metrics
    # Drafts were rejected, so the recurrent state went back to its snapshot each time.
    assert done.drafted_tokens > 0 and done.accepted_tokens < done.drafted_tokens
    assert done.cached_tokens > 0 and done.draft_cached_tokens > 0


def test_a_hybrid_draft_model_is_refused_with_the_reason(hybrid):
    with pytest.raises(DraftModelMismatchError, match="trimmable caches.*ArraysCache"):
        DraftModelDrafter(hybrid.model)
