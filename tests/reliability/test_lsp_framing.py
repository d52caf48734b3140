"""Broken LSP frames against the real server process: a logged error, an answer, resynchronisation.

Each case writes a broken frame and, in the same write, a valid `codectx.status`
request. The server must log the framing error, answer the broken frame with
-32700 (id null: its id cannot be known), and answer the valid request: it found
the next header. pygls' reader never recognised a header again after a wrong
Content-Length, and allocated whatever Content-Length said.

`FrameParser` is also fed each case in pieces of every size (the reads of a pipe
can split anywhere): the outcome must not depend on where the bytes were cut.

The exit-status tests check LSP's rule (0 after `shutdown`, 1 without) for `exit`
and for end of input.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from server.lsp.framing import MAX_CONTENT_LENGTH, BrokenFrame, FrameParser, Message
from tests.reliability.lsp_process import LspProcess, frame, workspace

STATUS = {"command": "codectx.status", "arguments": []}
FRAMING_ERROR = "ERROR server.lsp.framing: LSP framing error"


def status_request(msg_id: int) -> bytes:
    return frame({"jsonrpc": "2.0", "id": msg_id, "method": "workspace/executeCommand", "params": STATUS})


def body(msg_id: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": "workspace/executeCommand",
                       "params": STATUS}).encode()


def garbage(size: int) -> bytes:
    data = random.Random(15).randbytes(size)
    return data.replace(b"Content-Length:", b"Content-Lxngth:")


BROKEN = {
    "content-length too short": b"Content-Length: %d\r\n\r\n%s" % (len(body(900)) - 7, body(900)),
    "content-length a little too long": b"Content-Length: %d\r\n\r\n%s" % (len(body(901)) + 9, body(901)),
    "content-length far too long": b"Content-Length: %d\r\n\r\n%s" % (len(body(902)) + 100_000, body(902)),
    "garbage header line": b"this is not a header\r\n" + frame(body(903)),
    "missing content-length": b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + body(904),
    "non-numeric content-length": b"Content-Length: 12abc\r\n\r\n" + body(905),
    "negative content-length": b"Content-Length: -5\r\n\r\n" + body(906),
    "endless header line": b"X-Padding: " + b"a" * 5000 + b"\r\n\r\n" + body(907),
    "body not utf-8": frame(b"\xff\xfe" + body(908)[2:]),
    "body not json": frame(b"hello, server"),
    "binary garbage": garbage(200_000),
}
REASON = {  # what the logged error names
    "content-length too short": "not UTF-8 JSON", "content-length a little too long": "not UTF-8 JSON",
    "content-length far too long": "the next header arrived inside its body",
    "garbage header line": "not a 'Name: value' header line", "missing content-length": "without Content-Length",
    "non-numeric content-length": "Content-Length is not a number",
    "negative content-length": "Content-Length is not a number",
    "endless header line": "a header line longer than", "body not utf-8": "not UTF-8 JSON",
    "body not json": "not UTF-8 JSON", "binary garbage": "",
}


@pytest.fixture
async def server(tmp_path):
    process = await LspProcess.start(tmp_path / "home")
    # No `initialized`: the model is not loaded, which framing does not need.
    await process.initialize(workspace(tmp_path), {"warmup": {"enabled": False}})
    yield process
    await process.close()


def parse_errors(process: LspProcess) -> list[dict]:
    return [m for m in process.messages if m.get("id", 0) is None and m["error"]["code"] == -32700]


async def test_each_kind_of_broken_frame_is_logged_answered_and_skipped(server):
    for number, (case, broken) in enumerate(BROKEN.items(), start=1):
        errors_before = len(parse_errors(server))
        await server.send_raw(broken + status_request(100 + number))
        reply = await server.response(100 + number)
        assert reply["result"]["server"]["openDocuments"] == 0, case
        assert len(parse_errors(server)) > errors_before, case
        assert REASON[case] in parse_errors(server)[-1]["error"]["message"], case
        await server.log_line(FRAMING_ERROR + ".*" + REASON[case], count=1)
        assert len([line for line in server.stderr if FRAMING_ERROR in line]) >= number, case
    assert await server.status()  # and it goes on answering
    answered = {m["id"] for m in server.messages if "result" in m}
    # The broken frames were not taken, except the valid frame right after the garbage line.
    assert answered & set(range(900, 910)) == {903}


async def test_an_absurd_content_length_is_refused_without_allocating(server):
    await server.send_raw(b"Content-Length: 1000000000000000000\r\n\r\n" + status_request(1))
    assert "result" in await server.response(1)
    await server.log_line(FRAMING_ERROR + ".*over the limit of 67108864 bytes")


async def test_a_real_body_over_the_limit_is_skipped_in_bounded_memory(server):
    peak_before = peak_memory(server.process.pid)
    big = b'{"jsonrpc":"2.0","id":7,"method":"x","params":"' + b"a" * MAX_CONTENT_LENGTH + b'"}'
    await server.send_raw(frame(big) + status_request(2))
    assert "result" in await server.response(2, timeout=60)
    assert 7 not in {m.get("id") for m in server.messages}
    await server.log_line("resynchronised on a Content-Length header after skipping")
    assert peak_memory(server.process.pid) - peak_before < 32 * 1024 * 1024  # the 64 MiB never held


def peak_memory(pid: int) -> int:
    """The process's peak resident memory in bytes (Linux's VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


async def test_input_ending_inside_a_frame_is_logged_and_exits_1(server):
    await server.send_raw(b"Content-Length: 100\r\n\r\n{\"jsonrpc\":")
    server.process.stdin.close()
    assert await server.exit_code() == 1
    await server.log_line("ERROR server.lsp.framing: input ended inside a message")


@pytest.mark.parametrize("ending,code", [("exit", 1), ("shutdown+exit", 0), ("eof", 1), ("shutdown+eof", 0)])
async def test_exit_status_follows_lsp(tmp_path, ending, code):
    process = await LspProcess.start(tmp_path / "home")
    try:
        await process.initialize(workspace(tmp_path), {"warmup": {"enabled": False}})
        if ending.startswith("shutdown"):
            assert (await process.call("shutdown"))["result"] is None
            late = await process.call("workspace/executeCommand", STATUS)  # LSP: requests after shutdown fail
            assert late["error"]["code"] == -32600 and "after shutdown" in late["error"]["message"]
        if ending.endswith("exit"):
            await process.notify("exit")
        else:
            process.process.stdin.close()
        assert await process.exit_code() == code
    finally:
        await process.close()


@pytest.mark.parametrize("case", list(BROKEN))
def test_the_parser_recovers_however_the_bytes_are_split(case):
    stream = BROKEN[case] + status_request(1)
    for size in (1, 2, 3, 7, 64, 4096, len(stream)):
        parser, events = FrameParser(), []
        for start in range(0, len(stream), size):
            events += parser.feed(stream[start:start + size])
        messages = [e.data for e in events if isinstance(e, Message)]
        assert any(isinstance(e, BrokenFrame) for e in events), (case, size)
        assert messages[-1]["id"] == 1, (case, size)
        assert [m["id"] for m in messages[:-1]] == ([903] if case == "garbage header line" else []), (case, size)
