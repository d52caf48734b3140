"""`serve --stdio --http`: a huge HTTP prompt does not stall the editor's language server.

One process serves LSP on stdio (driven by pytest-lsp) and HTTP on loopback.
While an HTTP client's 400,000-character message is rendered and tokenized
(about 1.2M tokens with the 1M-context tiny model, then refused as too long),
the editor keeps asking `codectx.status`; each answer must come back in a
fraction of the time the HTTP request takes.
"""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.http.http_harness import engine_ready, free_port, stdio_http_config
from tests.server.harness import command, default_options, end_session, start

CONTENT = "\u20ac" * 400_000


PORT = free_port()
URL = f"http://127.0.0.1:{PORT}"


@pytest_lsp.fixture(config=stdio_http_config(PORT))
async def editor(lsp_client: LanguageClient, security_model, security_workspace):
    await start(lsp_client, "vscode", security_workspace, default_options(security_model))
    yield
    await end_session(lsp_client)


async def test_lsp_requests_answer_while_a_huge_http_prompt_is_tokenized(editor: LanguageClient):
    async with httpx.AsyncClient(base_url=URL, timeout=120) as http:
        model = (await engine_ready(http))["model"]
        started = time.perf_counter()
        huge = asyncio.ensure_future(http.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 1, "messages": [{"role": "user", "content": CONTENT}]}))
        latencies = []
        while not huge.done():
            asked = time.perf_counter()
            status = await command(editor, "codectx.status")
            latencies.append(time.perf_counter() - asked)
            assert status["model"] == model
        response = await huge
        seconds = time.perf_counter() - started
        assert response.status_code == 400
        assert "the prompt has" in response.json()["error"]["message"]  # really tokenized
        assert seconds > 0.5, f"the huge request took only {seconds:.2f} s: too fast to show anything"
        # A blocked loop answers nothing until the prompt is done (a few answers at most); a free one
        # answers hundreds, almost all at once. A single slow answer on a loaded machine is not a block.
        assert len(latencies) >= 20 and sorted(latencies)[int(0.9 * len(latencies))] < 0.1, \
            (len(latencies), sorted(latencies)[-5:], seconds)
        print(f"huge HTTP request {seconds:.2f} s; {len(latencies)} codectx.status answers meanwhile, "
              f"max {max(latencies) * 1000:.0f} ms")
        health = await http.get("/health")
        assert health.status_code == 200
