"""`AnswerStream` over the default model's tokenizer: the events a request's handle gets, and why it ended."""
from __future__ import annotations

import pytest

from engine.answer_stream import AnswerStream
from engine.handle import RequestHandle
from engine.jobs import Job
from engine.request import DoneEvent, Metrics, Request, SamplingParams, TokenEvent

TEXT = "def greet(name):\n    return f\"héllo, {name} 👋\"\n"


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from engine.loading import load_tokenizer

    return load_tokenizer(str(default_model_path))[0]


def stream_of(tokenizer, max_tokens: int, **request: object) -> tuple[AnswerStream, RequestHandle, list[str]]:
    req = Request(prompt_ids=[1, 2, 3], max_tokens=max_tokens, **request)
    handle, emitted = RequestHandle(req, cancel=lambda _: None), []
    return AnswerStream(Job(req, handle, None, 0), tokenizer, Metrics(), emitted), handle, emitted


def events(handle: RequestHandle) -> list[TokenEvent]:
    handle.push(DoneEvent(handle.request_id, "length", "", Metrics()))  # ends the iteration
    return [e for e in handle if isinstance(e, TokenEvent)]


@pytest.mark.parametrize("extra", [0, 1])
def test_every_token_reaches_the_handle_once_with_its_text(tokenizer, extra):
    """The events carry each token's id once, in order, their texts make the decoded text (bytes of one
    character held back until it is whole), the first one sets the TTFT, and the answer ends "length" at
    the limit and "stop" below it."""
    ids = tokenizer.encode(TEXT)
    stream, handle, emitted = stream_of(tokenizer, len(ids) + extra)
    assert not any(stream.add(t) for t in ids)
    reason = stream.finish()
    got = events(handle)
    assert [t for e in got for t in e.token_ids] == ids
    assert "".join(e.text for e in got) == "".join(emitted) == tokenizer.decode(ids) == TEXT
    assert all(e.text for e in got) and len(got) < len(ids)  # a character's bytes wait for it to be whole
    assert stream.metrics.decode_tokens == len(ids) and stream.metrics.ttft_s > 0
    assert reason == ("length" if extra == 0 else "stop")


def test_a_stop_string_ends_the_answer_before_it(tokenizer):
    ids = tokenizer.encode(TEXT)
    stream, handle, emitted = stream_of(tokenizer, 100, stop=("return",))
    stopped_at = next(i for i, t in enumerate(ids) if stream.add(t))
    assert "return" in tokenizer.decode(ids[:stopped_at + 1]) and "return" not in tokenizer.decode(ids[:stopped_at])
    assert "".join(emitted) == TEXT[:TEXT.index("return")]
    assert "".join(e.text for e in events(handle)) == "".join(emitted)


def test_a_loop_ends_the_answer_as_repetition(tokenizer):
    """The caller feeds the loop guard; once it fires, `finish` names it (and still pushes what was held)."""
    ids = tokenizer.encode("The cache keeps every checkpoint of the prefix. ") * 6
    stream, handle, emitted = stream_of(tokenizer, 500, sampling=SamplingParams(loop_guard=True))
    fired = None
    for i, t in enumerate(ids):
        stream.add(t)
        if stream.guard.observe(t):
            fired = i
            break
    assert fired is not None and fired < len(ids) - 1
    assert stream.finish() == "repetition"
    assert stream.metrics.loop_period > 0
    assert "".join(emitted) == tokenizer.decode(ids[:fired + 1])
