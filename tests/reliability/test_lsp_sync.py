"""Document sync against the real server process: impossible edits change nothing.

The buffer is observed through the docstring code action: its resolve returns a
`WorkspaceEdit` carrying the document's version and inserting below the `def`
line of the function it documents, as the server's buffer has it. A didChange
with an impossible change (a range that ends before it starts, a line far past
the end, a negative position) after valid ones is rejected as a whole: the
`def` stays where it was and the version stays. The rejection is logged every
time and shown (`window/showMessage`) once per document until it is reopened.
Positions past a line's end, or on the line just past the last, clamp (LSP).
"""
from __future__ import annotations

import pytest

from tests.reliability.lsp_process import LspProcess, options, tiny_model, workspace

SOURCE = "# ü😀 header\r\ndef target(a):\r\n    return a\r\n"  # the def on line 1 (0-based)
NOT_APPLIED = r"ERROR .*textDocument/didChange \(.*m\.py\) not applied"


def position(line: int, character: int) -> dict:
    return {"line": line, "character": character}


def change(start: tuple[int, int], end: tuple[int, int], text: str) -> dict:
    return {"range": {"start": position(*start), "end": position(*end)}, "text": text}


@pytest.fixture
async def server(tmp_path):
    process = await LspProcess.start(tmp_path / "home")
    process.root = workspace(tmp_path)
    (process.root / "m.py").write_text(SOURCE, encoding="utf-8", newline="")
    process.uri = (process.root / "m.py").as_uri()
    await process.initialize(process.root, options(tiny_model()), initialized=True)
    assert "result" in await process.call("workspace/executeCommand",
                                          {"command": "codectx.showContext", "arguments": []})
    yield process
    await process.close()


async def did_change(server: LspProcess, version: int, *changes: dict) -> None:
    await server.notify("textDocument/didChange", {"textDocument": {"uri": server.uri, "version": version},
                                                   "contentChanges": list(changes)})


async def def_line_and_version(server: LspProcess, def_line: int) -> tuple[int, int]:
    """(line the docstring goes to, document version) from resolving the docstring action at `def_line`."""
    reply = await server.call("codeAction/resolve", {"title": "docstring", "kind": "refactor.rewrite", "data": {
        "action": "docstring", "uri": server.uri, "range": {"start": position(def_line, 4),
                                                            "end": position(def_line, 4)}}})
    edit = reply["result"]["edit"]["documentChanges"][0]
    assert edit["textDocument"]["uri"] == server.uri
    return edit["edits"][0]["range"]["start"]["line"], edit["textDocument"]["version"]


def shown(server: LspProcess) -> list[str]:
    return [m["params"]["message"] for m in server.notifications("window/showMessage")]


async def test_impossible_edits_change_nothing_and_are_shown_once(server):
    await server.notify("textDocument/didOpen", {"textDocument": {
        "uri": server.uri, "languageId": "python", "version": 1, "text": SOURCE}})
    assert await def_line_and_version(server, 1) == (2, 1)

    # Valid: a line above the def, and a character after the emoji (UTF-16 column 5).
    await did_change(server, 2, change((0, 0), (0, 0), "x = 'é😀'\r\n"), change((1, 5), (1, 5), "!"))
    assert await def_line_and_version(server, 2) == (3, 2)

    # A valid change, then a reversed range: all or nothing.
    await did_change(server, 3, change((0, 0), (0, 0), "\r\n\r\n\r\n"), change((2, 5), (2, 1), "y"))
    assert await def_line_and_version(server, 2) == (3, 2)
    await server.log_line(NOT_APPLIED + r".*change 2 of 2: the range ends \(2:1\) before it starts \(2:5\)")
    assert len(shown(server)) == 1 and "version 2 kept" in shown(server)[0]

    # A line far past the end; a negative position (refused before it reaches the buffer).
    await did_change(server, 4, change((0, 0), (0, 0), "\r\n"), change((40, 0), (41, 0), ""))
    await did_change(server, 5, change((0, -1), (0, 0), "z"))
    assert await def_line_and_version(server, 2) == (3, 2)
    await server.log_line(NOT_APPLIED + ".*line 40 is past the end of the document")
    await server.log_line(NOT_APPLIED + ".*Position.character should be in range")
    assert len(shown(server)) == 1  # logged each time, shown once

    # Clamping, as LSP says: past a line's end, and the line just past the last.
    await did_change(server, 6, change((0, 999), (0, 999), " # end"), change((5, 0), (5, 3), "\r\npass\r\n"))
    assert await def_line_and_version(server, 2) == (3, 6)

    # Reopened: a new problem is shown again; a change to a document never opened is refused too.
    await server.notify("textDocument/didClose", {"textDocument": {"uri": server.uri}})
    await server.notify("textDocument/didOpen", {"textDocument": {
        "uri": server.uri, "languageId": "python", "version": 1, "text": SOURCE}})
    await did_change(server, 2, change((0, 3), (0, 0), ""))
    other = (server.root / "never_opened.py").as_uri()
    await server.notify("textDocument/didChange", {"textDocument": {"uri": other, "version": 2},
                                                   "contentChanges": [change((0, 0), (0, 0), "x")]})
    assert await def_line_and_version(server, 1) == (2, 1)
    assert len(shown(server)) == 3 and "which is not open" in shown(server)[2]
    assert (await server.status())["server"]["openDocuments"] == 1
