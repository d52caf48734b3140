"""The pygls 2.1.1 bookkeeping fixes in `CodectxProtocol`, driven message by message.

A bare `LanguageServer` with our protocol class and one async command; messages go
through `handle_message` and answers are read back from an in-memory writer.
"""
from __future__ import annotations

import asyncio
import json

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from server.lsp.protocol import CodectxProtocol


class Capture:
    """A pygls writer that keeps every JSON message."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.arrived = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.messages.append(json.loads(data.decode("utf-8").split("\r\n\r\n", 1)[1]))
        self.arrived.set()

    async def wait_answer(self, msg_id) -> dict:
        """Waits (on writes, not on time) until the answer to `msg_id` was written."""
        while (found := self.answer(msg_id)) is None:
            self.arrived.clear()
            await self.arrived.wait()
        return found

    def close(self) -> None:
        pass

    def answer(self, msg_id) -> dict | None:
        return next((m for m in self.messages if m.get("id") == msg_id and "method" not in m), None)


def make_server():
    server = LanguageServer("t", "0", protocol_cls=CodectxProtocol)
    writer = Capture()
    server.protocol.set_writer(writer)
    started, cancelled = asyncio.Event(), asyncio.Event()

    @server.command("slow")
    async def slow(ls, *args):
        started.set()
        try:
            await asyncio.Event().wait()  # runs until cancelled
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @server.command("raises_cancelled")
    async def raises_cancelled(ls, *args):
        raise asyncio.CancelledError()

    @server.command("quick")
    async def quick(ls, *args):
        return 1

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls, params):
        pass

    return server, writer, started, cancelled


def send(server, payload: dict) -> None:
    server.protocol.handle_message(server.protocol.structure_message(dict(payload, jsonrpc="2.0")))


def initialize(server) -> None:
    send(server, {"id": 0, "method": "initialize", "params": {"capabilities": {}}})


async def test_cancel_request_reaches_a_running_async_command():
    server, writer, started, cancelled = make_server()
    initialize(server)
    send(server, {"id": 1, "method": "workspace/executeCommand", "params": {"command": "slow", "arguments": []}})
    await started.wait()
    send(server, {"method": "$/cancelRequest", "params": {"id": 1}})
    await cancelled.wait()
    assert (await writer.wait_answer(1))["error"]["code"] == -32800
    assert server.protocol.pending_requests() == 0


async def test_a_stray_cancelled_error_still_answers_the_request():
    server, writer, _, _ = make_server()
    initialize(server)
    send(server, {"id": 2, "method": "workspace/executeCommand",
                  "params": {"command": "raises_cancelled", "arguments": []}})
    assert (await writer.wait_answer(2))["error"]["code"] == -32800


async def test_shutdown_with_a_command_in_flight():
    server, writer, started, cancelled = make_server()
    initialize(server)
    send(server, {"id": 3, "method": "workspace/executeCommand", "params": {"command": "slow", "arguments": []}})
    await started.wait()
    send(server, {"id": 4, "method": "shutdown", "params": None})
    await cancelled.wait()
    assert (await writer.wait_answer(3))["error"]["code"] == -32800
    assert await writer.wait_answer(4) == {"id": 4, "jsonrpc": "2.0", "result": None}


async def test_no_entry_leaks_per_notification_or_command():
    server, writer, started, _ = make_server()
    initialize(server)
    send(server, {"method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": "file:///a.py", "languageId": "python", "version": 1, "text": ""}}})
    for version in range(2, 52):
        send(server, {"method": "textDocument/didChange", "params": {
            "textDocument": {"uri": "file:///a.py", "version": version},
            "contentChanges": [{"text": str(version)}]}})
    for msg_id in range(10, 15):
        send(server, {"id": msg_id, "method": "workspace/executeCommand",
                      "params": {"command": "quick", "arguments": []}})
    for msg_id in range(10, 15):
        assert (await writer.wait_answer(msg_id))["result"] == 1
    assert server.protocol.pending_requests() == 0
