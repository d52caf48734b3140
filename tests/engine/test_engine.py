"""Engine behaviour on a tiny random-weight model: equivalences, cancel, order, stops."""
from __future__ import annotations

from engine.request import DoneEvent, Request, TokenEvent


def _prompt(tiny_loaded, text="def add(a, b):\n    return a + b\n"):
    tok = tiny_loaded.tokenizer
    return tok.encode(tok.render_chat([{"role": "user", "content": text}]))


def test_greedy_request_streams_tokens_then_one_done(engine, tiny_loaded):
    handle = engine.submit(Request(prompt_ids=_prompt(tiny_loaded), max_tokens=12))
    events = list(handle)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[-1], DoneEvent) and sum(isinstance(e, DoneEvent) for e in events) == 1
    done = events[-1]
    assert done.text == "".join(e.text for e in tokens)
    assert done.finish_reason in ("length", "stop")
    assert done.metrics.decode_tokens == sum(len(e.token_ids) for e in tokens) or done.finish_reason == "stop"
    assert done.metrics.prompt_tokens == len(_prompt(tiny_loaded))
