"""Bad requests against the real server process: each gets the right JSON-RPC error, and the server goes on.

Params of the wrong shape get -32602 naming the field (pygls raised inside its
read loop and never answered); messages that are not JSON-RPC get -32600;
unknown methods -32601. No error carries a traceback, and none is -32603: bad
input is the client's error, not the server's. After every case the server
still answers `codectx.status`.
"""
from __future__ import annotations

import json

import pytest

from tests.reliability.lsp_process import LspProcess, frame, options, tiny_model, workspace

HOVER = "textDocument/hover"


def hover(uri: str, line, character) -> dict:
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}


def command(name: str, *arguments) -> dict:
    return {"command": name, "arguments": list(arguments)}


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture
async def server(tmp_path, model):
    process = await LspProcess.start(tmp_path / "home")
    process.root = workspace(tmp_path)
    await process.initialize(process.root, options(model), initialized=True)
    loaded = await process.call("workspace/executeCommand", command("codectx.showContext"))
    assert "result" in loaded, loaded  # the model is loaded: hover really runs
    yield process
    await process.close()


def assert_clean_error(reply: dict, code: int, fragment: str) -> None:
    error = reply.get("error")
    assert error is not None, reply
    assert error["code"] == code, reply
    assert fragment in error["message"], reply
    assert "data" not in error and "Traceback" not in error["message"], reply


async def test_invalid_params_get_invalid_params_naming_the_field(server):
    main = (server.root / "main.py").as_uri()
    await server.notify("textDocument/didOpen", {"textDocument": {
        "uri": main, "languageId": "python", "version": 1, "text": (server.root / "main.py").read_text()}})
    missing = (server.root / "no_such_file.py").as_uri()
    cases = [
        (HOVER, hover(main, -1, 0), -32602, "params.position: Position.line should be in range"),
        (HOVER, hover(main, 0, -4), -32602, "but was -4"),
        (HOVER, hover(main, "3", 0), -32602, "params.position.line: expected an integer, got '3'"),
        (HOVER, hover(main, True, 0), -32602, "params.position.line: expected an integer, got True"),
        (HOVER, hover(5, 0, 0), -32602, "params.textDocument.uri: expected a string, got 5"),
        (HOVER, {"position": {"line": 0, "character": 0}}, -32602, "params.textDocument: required field missing"),
        (HOVER, 5, -32602, "params: expected an object (HoverParams)"),
        (HOVER, hover(main, 500, 0), -32602, "line 500 is past the end of the document (6 lines)"),
        ("workspace/executeCommand", command("codectx.findBugs", {"uri": missing, "range": {
            "start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}}}), -32602, "no_such_file.py"),
        ("codectx/noSuchMethod", {}, -32601, "codectx/noSuchMethod"),
        ("workspace/executeCommand", command("codectx.noSuchCommand"), -32602, "codectx.noSuchCommand"),
        ("workspace/executeCommand", command("codectx.ask", {"question": 5}), -32602, "non-empty string 'question'"),
        ("workspace/executeCommand", command("codectx.ask", {"question": "q", "maxTokens": "x"}), -32602,
         "'maxTokens' must be a positive integer"),
        ("workspace/executeCommand", command("codectx.ask", {"question": "q", "maxTokens": -5}), -32602,
         "'maxTokens' must be a positive integer"),
        ("workspace/executeCommand", command("codectx.ask", {"question": "q", "conversationId": []}), -32602,
         "'conversationId' must be a non-empty string"),
        ("codeAction/resolve", {"title": "x", "data": [1, 2]}, -32602, "'data' must be the object"),
        ("workspace/executeCommand", {"command": "codectx.ask", "arguments": 5}, -32602, "params.arguments"),
        ("workspace/executeCommand", command("codectx.findBugs", {"uri": main, "range": {"start": 1}}),
         -32602, "expected 'uri' and 'range'"),
    ]
    for method, params, code, fragment in cases:
        assert_clean_error(await server.call(method, params), code, fragment)
        assert (await server.status())["server"]["pendingRequests"] == 1  # the status request itself
    assert (await server.call(HOVER, hover(missing, 0, 0)))["result"] is None  # not readable: no hover
    # Positions past a line's end clamp (LSP): an answer, not an error.
    assert "result" in await server.call(HOVER, hover(main, 4, 10_000))
    assert "result" in await server.call(HOVER, hover(main, 5, 0))  # the line after the last


async def test_messages_that_are_not_json_rpc_get_invalid_request(server):
    cases = [  # (message, id the answer carries, message fragment)
        ({"jsonrpc": "1.0", "id": 1, "method": "shutdown"}, 1, '"jsonrpc" must be "2.0"'),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "shutdown"}, None, '"id" must be an integer or a string'),
        ({"jsonrpc": "2.0", "id": 2.5, "method": "shutdown"}, None, '"id" must be an integer or a string'),
        ({"jsonrpc": "2.0", "id": 3, "method": 12}, 3, '"method" must be a string'),
        ([{"jsonrpc": "2.0", "id": 4, "method": "shutdown"}], None, "batches (JSON arrays) are not part of LSP"),
        ("just a string", None, "a message must be a JSON object"),
        ({"jsonrpc": "2.0", "id": 5}, 5, "neither a request"),
    ]
    for message, msg_id, fragment in cases:
        before = len(server.messages)
        await server.send_raw(frame(json.dumps(message).encode()))
        await server.status()
        answers = [m for m in server.messages[before:] if "error" in m and m.get("id", "none") == msg_id]
        assert len(answers) == 1, (message, server.messages[before:])
        assert_clean_error(answers[0], -32600, fragment)
    assert (await server.status())["ready"] is True  # none of them was taken as `shutdown`


async def test_bad_notifications_are_logged_and_shown_once(server):
    uri = (server.root / "util.py").as_uri()
    bad_open = {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": 5}}
    await server.notify("textDocument/didOpen", bad_open)
    await server.notify("textDocument/didOpen", bad_open)
    assert (await server.status())["server"]["openDocuments"] == 0
    await server.log_line(r"ERROR .*textDocument/didOpen \(.*util.py\) not applied: invalid params for "
                          r"textDocument/didOpen: params.textDocument.text: expected a string, got 5", count=2)
    shown = server.notifications("window/showMessage")
    assert len(shown) == 1 and "params.textDocument.text" in shown[0]["params"]["message"]
    await server.notify("codectx/noSuchNotification", {})  # unknown notifications are ignored (JSON-RPC)
    assert (await server.status())["server"]["openDocuments"] == 0


async def test_invalid_initialize_is_answered_and_a_valid_one_still_works(tmp_path):
    process = await LspProcess.start(tmp_path / "home")
    try:
        reply = await process.call("initialize", {"processId": None, "capabilities": 5})
        assert_clean_error(reply, -32602, "params.capabilities: expected an object (ClientCapabilities)")
        assert "capabilities" in await process.initialize(workspace(tmp_path), {"warmup": {"enabled": False}})
        assert await process.status()
    finally:
        await process.close()


async def test_an_unreadable_client_response_fails_the_waiting_request(tmp_path, model):
    process = await LspProcess.start(tmp_path / "home")
    try:
        process.answers["workspace/configuration"] = 5  # a list is required
        await process.initialize(workspace(tmp_path), options(model), initialized=True,
                                 capabilities={"workspace": {"configuration": True}})
        reply = await process.call("workspace/executeCommand", command("codectx.showContext"))
        assert_clean_error(reply, -32602, "invalid response to request")  # an answer, not a hang
        assert (await process.status())["ready"] is False
    finally:
        await process.close()
