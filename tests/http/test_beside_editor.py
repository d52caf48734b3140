"""`codectx serve --stdio --http`: one process, one engine for the editor and the OpenAI API.

The Done-when of issue #9: an OpenAI client pointed at codectx gets streamed
answers whose cached_tokens reflect the editor's warm prefix.
"""
from __future__ import annotations

import httpx
import openai
import pytest_lsp
from pytest_lsp import LanguageClient

from server.http.prometheus import parse
from tests.http.http_harness import engine_ready, free_port, stdio_http_config
from tests.server.harness import command, default_options, end_session, start


PORT = free_port()
URL = f"http://127.0.0.1:{PORT}"


@pytest_lsp.fixture(config=stdio_http_config(PORT))
async def editor(lsp_client: LanguageClient, http_model, http_workspace):
    await start(lsp_client, "vscode", http_workspace, default_options(http_model))
    yield
    await end_session(lsp_client)


async def test_openai_client_streams_over_the_editors_warm_prefix(editor: LanguageClient):
    async with httpx.AsyncClient(base_url=URL, timeout=60) as http:
        health = await engine_ready(http)
        assert health["repository"] is True
        answer = await command(editor, "codectx.ask", question="What does util.py define?")
        assert answer["finishReason"] in ("stop", "length")
        context = await command(editor, "codectx.showContext")
        prefix_tokens = sum(row["tokens"] for row in context["segments"])

        client = openai.AsyncOpenAI(base_url=URL + "/v1", api_key="local", max_retries=0)
        assert [m.id async for m in client.models.list()][-1] == "codectx"
        stream = await client.chat.completions.create(
            model="codectx", stream=True, max_tokens=6, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Who calls add?"}])
        chunks = [chunk async for chunk in stream]
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        usage = chunks[-1].usage
        assert pieces and usage.completion_tokens >= 1
        assert usage.prompt_tokens > prefix_tokens
        assert usage.prompt_tokens_details.cached_tokens >= prefix_tokens  # the editor's checkpoints

        metrics = parse((await http.get("/metrics")).text)
        assert metrics['codectx_engine_requests_total{outcome="served"}'] >= 2  # the ask and ours: one engine
        assert metrics["codectx_http_cached_tokens_total"] == usage.prompt_tokens_details.cached_tokens
