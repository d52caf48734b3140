"""codectx.ask end to end: streaming, cancellation, shutdown and edits while generating.

The tests share the module's server (`shared`; what they count is counted from the
status before they start), except the shutdown test, which ends its own.
"""
from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from tests.server.harness import cancel_request, command, start_command
from tests.server.shared_server import SHARED, close_document

LONG = 2000  # decode budget large enough to still be running when the test cancels
# Checked on the tiny model: greedy output for this question does not reach EOS within LONG tokens.
ENDLESS = "Write a long essay about util.py."


def streamed(client, request_id=None) -> str:
    return "".join(p.text for p in client.streams if request_id is None or p.requestId == request_id)


async def first_stream_token(client) -> None:
    while not any(p.text for p in client.streams):
        await client.wait_for_notification("codectx/stream")


async def status(client) -> dict:
    return await command(client, "codectx.status")


async def stream_done(client, count: int = 1) -> None:
    """Waits until `count` streams have sent their last notification."""
    while sum(p.done for p in client.streams) < count:
        await client.wait_for_notification("codectx/stream")


@SHARED
async def test_stream_concatenation_equals_result(shared):
    client = shared
    client.progress_reports.clear()
    result = await command(client, "codectx.ask", question="What does add do?", maxTokens=12)
    assert result["text"] and result["text"] == streamed(client)
    assert client.streams[-1].done is True and client.streams[-1].finishReason == result["finishReason"]
    metrics = result["metrics"]
    assert metrics["prompt_tokens"] > 0 and metrics["decode_tokens"] >= 1
    assert metrics["ttft_s"] > 0 and "decode_tps" in metrics
    reports = [r for reports in client.progress_reports.values() for r in reports]
    assert any(r.kind == "report" and r.message == client.streams[0].text for r in reports)


@SHARED
async def test_greedy_answer_is_repeatable_within_a_conversation_free_ask(shared):
    client = shared
    first = await command(client, "codectx.ask", question="Explain greet.", maxTokens=10)
    second = await command(client, "codectx.ask", question="Explain greet.", maxTokens=10)
    assert first["text"] == second["text"]
    assert first["conversationId"] != second["conversationId"]


@SHARED
async def test_cancel_mid_decode_then_a_correct_request(shared):
    client = shared
    before = await status(client)
    reference = await command(client, "codectx.ask", question="Explain greet.", maxTokens=10)
    client.streams.clear()
    task = start_command(client, "ask-1", "codectx.ask", question=ENDLESS, maxTokens=LONG)
    await first_stream_token(client)
    cancel_request(client, "ask-1")
    with pytest.raises(JsonRpcException) as info:
        await task
    assert info.value.code == -32800
    # The stream's last notification went out before the answer: it is here already.
    assert [p.finishReason for p in client.streams if p.done] == ["cancelled"]
    after = await command(client, "codectx.ask", question="Explain greet.", maxTokens=10)
    assert after["text"] == reference["text"]
    state = await status(client)
    assert state["counters"]["cancelled"] == before["counters"]["cancelled"] + 1
    assert state["engine"]["requests_cancelled"] == before["engine"]["requests_cancelled"] + 1
    assert state["engine"]["decode_tokens"] - before["engine"]["decode_tokens"] < 3 * 10 + LONG


@SHARED
async def test_cancel_mid_prefill_then_a_correct_request(shared):
    client = shared
    before = await status(client)
    big = "\n".join(f"def f{i}(x):\n    return x * {i}  # {'ü' * (i % 5)}" for i in range(80))
    (client.root / "big.py").write_text(big, encoding="utf-8")
    await command(client, "codectx.reindex")
    reference = await command(client, "codectx.ask", question="Explain greet.", maxTokens=6)
    client.progress_reports.clear()
    task = start_command(client, "ask-2", "codectx.ask", question=ENDLESS, maxTokens=LONG)

    def prefill_reports():
        return [r for rs in client.progress_reports.values() for r in rs
                if r.kind == "report" and r.percentage is not None]
    while not prefill_reports():
        await client.wait_for_notification(types.PROGRESS)
    assert prefill_reports()[0].percentage < 100
    cancel_request(client, "ask-2")
    with pytest.raises(JsonRpcException) as info:
        await task
    assert info.value.code == -32800
    after = await command(client, "codectx.ask", question="Explain greet.", maxTokens=6)
    assert after["text"] == reference["text"]
    state = await status(client)
    assert state["engine"]["requests_cancelled"] == before["engine"]["requests_cancelled"] + 1
    await stream_done(client, count=3)  # reference, cancelled, after
    (client.root / "big.py").unlink()  # the module's workspace as it was
    await command(client, "codectx.reindex")


@SHARED
async def test_progress_cancel_answers_the_request_as_cancelled(shared):
    client = shared
    before = await status(client)
    client.progress_reports.clear()
    task = asyncio.ensure_future(command(client, "codectx.ask", question=ENDLESS, maxTokens=LONG))
    await first_stream_token(client)
    token = next(t for t in client.progress_reports if str(t).startswith("codectx-ask"))
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    with pytest.raises(JsonRpcException) as info:
        await task
    assert info.value.code == -32800
    await stream_done(client)
    state = await status(client)
    assert state["counters"]["cancelled"] == before["counters"]["cancelled"] + 1
    assert state["server"]["progressTokens"] == 0


@SHARED
async def test_did_change_storm_during_generation_leaks_nothing(shared):
    client = shared
    before = await status(client)
    uri = (client.root / "util.py").as_uri()
    text = (client.root / "util.py").read_text(encoding="utf-8")
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    task = asyncio.ensure_future(command(client, "codectx.ask", question="What does add do?", maxTokens=40))
    await first_stream_token(client)
    for version in range(2, 202):
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="#")]))
    result = await task
    assert result["text"] == streamed(client)
    state = await status(client)
    assert state["prefixVersion"] == before["prefixVersion"] + 200
    # Only the status request itself is in flight: no entry per notification or command.
    assert before["server"]["openDocuments"] == 0
    assert state["server"] == {"pendingRequests": 1, "progressTokens": 0, "openDocuments": 1}
    close_document(client, client.root / "util.py")


async def test_shutdown_with_a_request_in_flight(vscode_client):
    client = vscode_client
    task = asyncio.ensure_future(command(client, "codectx.ask", question=ENDLESS, maxTokens=LONG))
    await first_stream_token(client)
    assert await client.shutdown_async(None) is None
    with pytest.raises(JsonRpcException) as info:
        await task
    assert info.value.code == -32800
    client.exit(None)
    assert await client._server.wait() == 0  # noqa: SLF001 - pytest-lsp keeps the process here


@SHARED
async def test_a_client_work_done_token_carries_the_stream(shared):
    client = shared
    client.progress_reports.clear()
    token = "client-token"
    client.progress_reports[token] = []  # the client created it; the server must not create another
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="codectx.ask", arguments=[{"question": "What does add do?", "maxTokens": 8}],
        work_done_token=token))
    reports = client.progress_reports[token]
    assert reports[0].kind == "begin" and reports[-1].kind == "end"
    deltas = [r.message for r in reports if r.kind == "report" and r.percentage is None]
    assert result["text"] and "".join(deltas) == result["text"] == streamed(client)
    assert not [t for t in client.progress_reports if str(t).startswith("codectx-ask")]


@SHARED
async def test_a_question_or_answer_that_cannot_fit_the_context_is_refused_and_the_next_ask_answers(shared):
    """A huge paste is refused by its characters, before it is tokenized on the server's loop; one that is
    tokenized and still cannot fit, or an answer as long as the context, is refused before the engine sees it:
    neither holds the engine for minutes while the next ask waits."""
    client = shared
    before = await status(client)
    cases = [(dict(question="x " * 1_000_000, maxTokens=4), "refused before tokenizing"),
             (dict(question="def f(): pass\n" * 3000, maxTokens=4), "the question and its selection are"),
             (dict(question="Explain greet.", maxTokens=10**9), "leaves no room for the prompt")]
    for arguments, fragment in cases:
        with pytest.raises(JsonRpcException) as info:
            await command(client, "codectx.ask", **arguments)
        assert info.value.code == -32602 and fragment in str(info.value)
    answered = await command(client, "codectx.ask", question="Explain greet.", maxTokens=4)
    assert answered["finishReason"] in ("length", "stop")
    state = await status(client)
    assert state["engine"]["requests_served"] == before["engine"]["requests_served"] + 1  # only the last one ran
