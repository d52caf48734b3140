"""The engine refuses a request that would run past the model's trained context, before it runs."""
from __future__ import annotations

import pytest

from engine.errors import ContextOverflowError
from engine.request import DoneEvent, PromptSegment, Request
from tiny_models import corpus


def test_a_request_past_the_models_context_is_refused_before_it_runs_and_nothing_is_lost(engine, tiny_loaded):
    """The tiny model's context is 4,096 tokens: a prompt and `max_tokens` summing past it are refused at submit,
    alone or in a batch; one that just fits runs, and the engine's counters saw no request of the refused."""
    context = tiny_loaded.context_length
    ids = list(tiny_loaded.tokenizer.encode(corpus() * 4))[:context - 4]
    assert len(ids) == context - 4
    with pytest.raises(ContextOverflowError, match=f"{context - 4} tokens and asks for up to 5 more.*{context}"):
        engine.submit(Request(prompt_ids=ids, max_tokens=5))
    segments = [PromptSegment("file", "a.py", tuple(ids[:100])), PromptSegment("question", "", tuple(ids[100:]))]
    with pytest.raises(ContextOverflowError):
        engine.submit_batch([Request(segments=segments, max_tokens=8), Request(segments=segments[:1], max_tokens=8)])
    assert engine.stats()["requests_served"] == 0 and engine.wait_idle(timeout=5)
    done = [e for e in engine.submit(Request(prompt_ids=ids, max_tokens=4))][-1]  # exactly the context
    assert isinstance(done, DoneEvent) and done.finish_reason == "length" and engine.stats()["requests_served"] == 1
