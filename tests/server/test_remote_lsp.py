"""The language server on a remote engine (llama.cpp's `llama-server` on the default model's GGUF,
`mlx_lm.server` on the tiny test model; loopback), set through `engine.url` in the initialization
options: hover and ask answer from the server, the second ask reports the prefix the server
reused, warm-up fills the server's cache, and cancelling an ask stops the server."""
from __future__ import annotations

import asyncio
import time

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from server.core.remote.openai_stream import Endpoint
from tests.server.harness import cancel_request, command, default_options, open_document, start, start_command


@pytest.fixture(params=["llama-server", "mlx_lm.server"])
def remote(request, default_model_path, tiny_model):
    """(API root, local model directory) of each engine server: llama.cpp's on the default model's
    GGUF, mlx_lm's on the tiny test model."""
    if request.param == "llama-server":
        _, url = request.getfixturevalue("llama")
        return url, default_model_path
    _, url = request.getfixturevalue("mlx_server")
    return url, tiny_model


async def test_hover_and_ask_run_on_the_remote_engine(raw_client, remote):
    url, model = remote
    await start(raw_client, "neovim", raw_client.root,
                default_options(model, engine={"url": url},
                                hover={"maxTokens": 8, "latencyBudgetMs": 60000, "prefetch": 0, "prefetchHeads": False}))
    await command(raw_client, "codectx.showContext")  # answers once the tokenizer is loaded and the scan done
    uri = open_document(raw_client, raw_client.root / "util.py")
    hover = await raw_client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(3, 5)))  # def add
    assert "**add** (function" in hover.contents.value and "`add` is" in hover.contents.value

    first = await command(raw_client, "codectx.ask", question="What does add do?", maxTokens=6)
    second = await command(raw_client, "codectx.ask", question="What does greet do?", maxTokens=6)
    assert first["text"] and second["text"]
    metrics = second["metrics"]
    assert metrics["prompt_tokens"] > metrics["cached_tokens"] > 0  # the server reused the repository prefix
    assert metrics["recomputed_tokens"] == metrics["prompt_tokens"] - metrics["cached_tokens"]
    status = await command(raw_client, "codectx.status")
    assert status["engine"]["engine"] == "remote" and status["engine"]["url"] == url


async def test_warm_up_puts_the_prefix_in_the_servers_cache_after_start_and_after_an_edit(
        raw_client, llama, default_model_path):
    _, url = llama
    warmth = []

    @raw_client.feature("codectx/warmth")
    def on_warmth(params):
        if not hasattr(params, "prefilled"):
            warmth.append(params)

    async def finished(count: int):
        while len(warmth) < count:
            await raw_client.wait_for_notification("codectx/warmth")
        return warmth[count - 1]

    await start(raw_client, "neovim", raw_client.root,
                default_options(default_model_path, engine={"url": url}, warmup={"enabled": True, "debounceMs": 0}))
    first = await finished(1)
    assert first.warm is True and first.lastRun.cachedTokens == 0 and first.lastRun.recomputedTokens > 0

    uri = open_document(raw_client, raw_client.root / "util.py")
    raw_client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="# edited\n")]))
    second = await finished(2)
    # The server reused the prefix up to the edit and computed the rest (its own counts).
    assert second.lastRun.cachedTokens > 0 and 0 < second.lastRun.recomputedTokens < second.prefixTokens

    asked = await command(raw_client, "codectx.ask", question="What does add do?", maxTokens=4)
    # Warm-up left the prefix there: all of it but the token or two at its end, where the server
    # tokenizes the text across the boundary with what follows.
    assert asked["metrics"]["cached_tokens"] >= second.prefixTokens - 2


async def test_cancel_in_the_editor_stops_the_servers_generation(raw_client, llama, default_model_path):
    _, url = llama
    slots = Endpoint(url.removesuffix("/v1"))
    await start(raw_client, "neovim", raw_client.root, default_options(default_model_path, engine={"url": url}))
    await command(raw_client, "codectx.showContext")
    task = start_command(raw_client, "ask-1", "codectx.ask", question="Write a long essay about util.py.",
                         maxTokens=2000)
    while not any(p.text for p in raw_client.streams):  # the server is generating
        await raw_client.wait_for_notification("codectx/stream")
    assert any(slot["is_processing"] for slot in slots.get_json("slots"))
    cancel_request(raw_client, "ask-1")
    with pytest.raises(JsonRpcException) as info:
        await task
    assert info.value.code == -32800  # RequestCancelled
    deadline = time.monotonic() + 20  # the server notices the closed connection at its next write
    while any(slot["is_processing"] for slot in slots.get_json("slots")):
        assert time.monotonic() < deadline, "the server kept generating after the editor cancelled"
        await asyncio.sleep(0.1)
    status = await command(raw_client, "codectx.status")
    assert status["engine"]["requests_cancelled"] == 1


async def test_hover_answers_prepared_on_the_server_come_from_the_cache(raw_client, llama, default_model_path):
    _, url = llama
    prepared = asyncio.Event()

    @raw_client.feature("codectx/warmth")
    def on_warmth(params):
        if params.hoverPrefetch.prepared >= 1:
            prepared.set()

    await start(raw_client, "neovim", raw_client.root, default_options(
        default_model_path, engine={"url": url}, warmup={"enabled": True, "debounceMs": 0},
        hover={"maxTokens": 8, "latencyBudgetMs": 60000, "prefetch": 1, "prefetchHeads": False}))
    uri = open_document(raw_client, raw_client.root / "util.py")  # `add` comes first in reading order
    await prepared.wait()
    before = await command(raw_client, "codectx.status")
    hover = await raw_client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(3, 5)))  # def add
    after = await command(raw_client, "codectx.status")
    assert "`add` is" in hover.contents.value
    assert after["counters"]["hoverCacheHits"] == before["counters"]["hoverCacheHits"] + 1
    assert after["engine"]["requests_served"] == before["engine"]["requests_served"]  # nothing sent to the server
