"""Tool calls in model output come back as OpenAI `tool_calls` (streamed and not).

The tiny random-weight model cannot write a tool call, so the HTTP test
scripts the engine's output (as tests/server/scripted.py does for the
editor's tool loop); the handle, the app, uvicorn and the openai client are real.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import openai
import pytest

from engine.handle import RequestHandle
from engine.loading import load_model
from engine.request import DoneEvent, Metrics, Request, TokenEvent
from server.core.backend import EngineBackend
from server.core.outcomes import Outcomes
from server.http.app import create_app
from server.http.config import HttpConfig
from server.http.runner import HttpServer
from server.http.source import Served
from server.http.tool_calls import ToolCallStream, split_tool_calls

CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "util.py"}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def test_split_keeps_text_and_invalid_blocks():
    text, calls = split_tool_calls("Let me look. " + CALL)
    assert text == "Let me look."
    assert calls == [{"index": 0, "id": "call_0", "type": "function",
                      "function": {"name": "read_file", "arguments": '{"path": "util.py"}'}}]
    assert split_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert split_tool_calls("no calls") == ("no calls", [])


@pytest.mark.parametrize("pieces", [[CALL], ["Sure <tool", "_call>", CALL[len("<tool_call>"):]],
                                    list("Sure " + CALL)])
def test_stream_holds_back_calls_however_split(pieces):
    stream = ToolCallStream()
    sent = "".join(stream.push(p) for p in pieces)
    rest, calls = stream.finish()
    assert "<" not in sent and [c["function"]["name"] for c in calls] == ["read_file"]
    assert (sent + rest).strip() in ("", "Sure")


def test_stream_releases_a_false_start():
    stream = ToolCallStream()
    sent = stream.push("a <tool") + stream.push("box> b")
    assert sent == "a <toolbox> b" and stream.finish() == ("", [])


@dataclass
class ScriptedEngine:
    """Answers every request with `text`, through a real `RequestHandle`."""

    text: str

    def submit(self, request: Request, on_progress=None) -> RequestHandle:
        handle = RequestHandle(request, lambda request_id: None)
        for piece in (self.text[:9], self.text[9:30], self.text[30:]):
            handle.push(TokenEvent(request.request_id, piece, (1,)))
        metrics = Metrics(prompt_tokens=len(request.all_token_ids()), decode_tokens=3)
        handle.push(DoneEvent(request.request_id, "stop", self.text, metrics))
        return handle

    def stats(self) -> dict:
        return {"requests_served": 0, "requests_cancelled": 0, "requests_failed": 0, "prompt_tokens": 0,
                "decode_tokens": 0, "queued": 0, "running": None, "cache": {}}


class ScriptedSource:
    def __init__(self, tokenizer) -> None:
        self.served = Served(EngineBackend(ScriptedEngine("Reading. " + CALL), tokenizer, "scripted"))
        self._outcomes = Outcomes()

    def current(self) -> Served:
        return self.served

    async def repository_segments(self, turns):
        raise LookupError("no workspace")

    def outcomes(self) -> Outcomes:
        return self._outcomes


@pytest.fixture(scope="module")
def scripted_url(http_model):
    server = HttpServer(create_app(ScriptedSource(load_model(str(http_model), progress=False).tokenizer),
                                   HttpConfig(port=0)), "127.0.0.1", 0)
    server.start()
    yield server.url
    server.stop()


def test_openai_client_gets_tool_calls(scripted_url):
    client = openai.OpenAI(base_url=scripted_url + "/v1", api_key="local", max_retries=0)
    messages = [{"role": "user", "content": "What is in util.py?"}]
    reply = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Reading."
    assert choice.message.tool_calls[0].function.name == "read_file"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"path": "util.py"}

    chunks = list(client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas).strip() == "Reading."
    calls = [call for d in deltas for call in (d.tool_calls or [])]
    assert [(c.index, c.id, c.function.name) for c in calls] == [(0, "call_0", "read_file")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    plain = client.chat.completions.create(model="scripted", messages=messages)  # no tools: text as is
    assert plain.choices[0].message.content == "Reading. " + CALL and not plain.choices[0].message.tool_calls
