"""One end-to-end run with the real default model (SmolLM2-135M-Instruct)."""
from __future__ import annotations

import time

import pytest
from lsprotocol import types

from tests.server.harness import command, open_document, start


@pytest.mark.default_model
async def test_default_model_answers_ask_and_hover(raw_client):
    await start(raw_client, "vscode", raw_client.root,
                {"ask": {"maxTokens": 24}, "hover": {"maxTokens": 24, "latencyBudgetMs": 120000},
                 "warmup": {"enabled": False}, "memory": {"archiveEnabled": False}})
    result = await command(raw_client, "codectx.ask", question="What does the function add return?")
    assert result["text"].strip() and result["text"] == "".join(p.text for p in raw_client.streams)
    assert result["metrics"]["prompt_tokens"] > 100
    uri = open_document(raw_client, raw_client.root / "util.py")
    started = time.perf_counter()
    hover = await raw_client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(3, 5)))
    cold = time.perf_counter() - started
    assert hover.contents.value.startswith("**add** (function, `util.py:4`)")
    started = time.perf_counter()
    again = await raw_client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(3, 5)))
    cached = time.perf_counter() - started
    assert again.contents.value == hover.contents.value and cached < cold
    print(f"default model: ask metrics {result['metrics']}; hover cold {cold:.2f}s, cached {cached * 1000:.1f} ms")
