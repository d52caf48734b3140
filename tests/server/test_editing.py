"""Hover and code actions end to end, including applying the returned edits.

The end-to-end tests share the module's server of each client kind (`shared_each_kind`:
the edits are applied in the negotiated position encoding); each leaves the server as
it found it (documents closed, files removed) and counts from the status before it.
What only the core decides (a hover over its latency budget, a hover right after an
edit) is checked in process through the core.
"""
from __future__ import annotations

import ast
import asyncio
import os
import shutil

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import client_capabilities

from server.core.features import ask as ask_feature
from server.core.features import hover as hover_feature
from server.core.features import status as status_feature
from tests.server.harness import apply_edits, command, default_options, edit_buffer, loaded_host, open_document
from tests.server.shared_server import SHARED, close_document

ADD_LINE = 4  # `    print(greet("café"), add(1, 2))` in main.py


def add_position(client) -> types.Position:
    line = (client.root / "main.py").read_text(encoding="utf-8").splitlines()[ADD_LINE]
    prefix = line[: line.index("add(")]
    encoding = client.init_result.capabilities.position_encoding
    units = len(prefix.encode("utf-8")) if encoding == "utf-8" else len(prefix.encode("utf-16-le")) // 2
    return types.Position(ADD_LINE, units + 1)


async def hover(client, uri, position):
    return await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=position))


def insert_line(client, uri: str, version: int, line: int, text: str) -> None:
    """didChange inserting `text` at the start of 0-based `line`."""
    at = types.Position(line, 0)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text=text)]))


async def hover_counts(client) -> tuple[int, int]:
    counters = (await command(client, "codectx.status"))["counters"]
    return counters["hovers"], counters["hoverCacheHits"]


@SHARED
async def test_hover_is_cached_then_invalidated_by_a_dependency_edit(shared_each_kind):
    """The only test of the module's servers that hovers `add` or `main`: the first hovers miss."""
    client = shared_each_kind
    hovers, hits = await hover_counts(client)
    main_uri = open_document(client, client.root / "main.py")
    position = add_position(client)  # after "café" on its line: non-ASCII columns
    first = await hover(client, main_uri, position)
    assert "**add** (function, `util.py:4`)" in first.contents.value and "def add(a, b):" in first.contents.value
    start = position.character - 1
    assert (first.range.start, first.range.end) == (types.Position(ADD_LINE, start), types.Position(ADD_LINE, start + 3))
    main_position = types.Position(3, 5)  # `def main():` uses greet and add
    main_first = await hover(client, main_uri, main_position)
    assert "**main** (function, `main.py:4`)" in main_first.contents.value
    last = (await command(client, "codectx.status"))["lastHover"]
    assert 0 < last["firstTokenS"] <= last["totalS"] and last["promptTokens"] > 0
    assert (await hover(client, main_uri, main_position)).contents.value == main_first.contents.value
    assert await hover_counts(client) == (hovers + 3, hits + 1)

    util_uri = open_document(client, client.root / "util.py")
    insert_line(client, util_uri, 2, 0, "# edited\n")  # same file, but nothing add or main uses
    moved = await hover(client, main_uri, position)
    assert "**add** (function, `util.py:5`)" in moved.contents.value  # the new place, the cached answer
    assert moved.contents.value.split("\n\n")[1] == first.contents.value.split("\n\n")[1]
    assert (await hover(client, main_uri, main_position)).contents.value == main_first.contents.value
    assert await hover_counts(client) == (hovers + 5, hits + 3)

    insert_line(client, util_uri, 3, 10, "    name = name.strip()\n")  # inside greet, which main uses
    await hover(client, main_uri, main_position)
    assert await hover_counts(client) == (hovers + 6, hits + 3)  # main regenerated
    await hover(client, main_uri, position)
    assert await hover_counts(client) == (hovers + 7, hits + 4)  # add does not use greet: still cached
    for name in ("main.py", "util.py"):
        close_document(client, client.root / name)


async def test_hover_over_budget_returns_the_static_card_then_the_answer(tiny_model, workspace):
    """In process: the default budget (0) answers at once with the static card and a pending
    line; the answer lands in the cache meanwhile and the next hover shows it."""
    host = await loaded_host(default_options(tiny_model, hover={"latencyBudgetMs": 0}), workspace)
    session = host.ready_now()
    try:
        result = await explain(session, "add", workspace / "main.py")
        assert result.source == "signature"
        assert result.markdown == ("**add** (function, `util.py:4`)\n\n```\ndef add(a, b):\n```\n\nReturns a + b."
                                   f"\n\nReferenced in 1 of 2 files in context.\n\n{hover_feature.PENDING_LINE}")
        # The answer is still being generated; the engine serves equal priorities in order,
        # so once a later ask is answered the hover's answer is done too (and then stored).
        await ask_feature.ask(session, "hi", on_text=lambda text: None,
                              max_tokens=1)
        await asyncio.gather(*session.hover_cache.pending.values())
        filled = await explain(session, "add", workspace / "main.py")
        assert filled.source == "cache" and filled.markdown != result.markdown
        assert filled.markdown.startswith("**add** (function, `util.py:4`)\n\n")
        assert filled.markdown.endswith("```\ndef add(a, b):\n```\n\nReferenced in 1 of 2 files in context.")
        counters = session.counters
        assert (counters.hovers, counters.hover_cache_hits) == (2, 1)
    finally:
        host.close()


async def explain(session, name: str, current):
    """What the hover handler asks the core for `name` under the cursor in `current`."""
    return await hover_feature.explain(session, session.hover_cache, name, current, session.prompt.files)


@SHARED
async def test_code_actions_list_instantly_and_resolve(shared_each_kind):
    client = shared_each_kind
    uri = open_document(client, client.root / "util.py")
    text = (client.root / "util.py").read_text(encoding="utf-8")
    rng = types.Range(start=types.Position(9, 4), end=types.Position(9, 10))  # inside greet
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=rng,
        context=types.CodeActionContext(diagnostics=[])))
    by_action = {a.data["action"]: a for a in actions}
    assert set(by_action) == {"explain", "docstring", "findBugs", "tests", "ask"}
    assert all(a.edit is None and a.command is None for a in actions)
    encoding = client.init_result.capabilities.position_encoding

    doc_action = await client.code_action_resolve_async(by_action["docstring"])
    change = doc_action.edit.document_changes[0]
    assert change.text_document.uri == uri and change.text_document.version == 1
    edited = apply_edits(text, change.edits, encoding)
    tree = ast.parse(edited)
    greet = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "greet")
    assert ast.get_docstring(greet) and edited.count("\n") == text.count("\n") + 1

    test_action = await client.code_action_resolve_async(by_action["tests"])
    create, insert = test_action.edit.document_changes
    assert create.kind == "create" and create.uri.endswith("/tests/test_util.py")
    test_file = apply_edits("", insert.edits, encoding)
    assert test_file.startswith("from util import greet\n")
    assert any(isinstance(n, ast.FunctionDef) and n.name.startswith("test") for n in ast.parse(test_file).body)

    explain = await client.code_action_resolve_async(by_action["explain"])
    assert explain.command.command == "codectx.ask"
    answer = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=explain.command.command, arguments=explain.command.arguments))
    assert answer["text"]

    # "Ask about selection": the editor asks for a question, then calls codectx.ask with the selection.
    ask = await client.code_action_resolve_async(by_action["ask"])
    assert ask.command.command == "codectx.askAboutSelection"
    (selection,) = ask.command.arguments
    plain = await command(client, "codectx.ask", question="Is this right?", maxTokens=1)
    asked = await command(client, "codectx.ask", question="Is this right?", maxTokens=1, **selection)
    assert asked["metrics"]["prompt_tokens"] > plain["metrics"]["prompt_tokens"]  # the selection is in it

    bugs = await client.code_action_resolve_async(by_action["findBugs"])
    assert bugs.command.command == "codectx.findBugs"
    found = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=bugs.command.command, arguments=bugs.command.arguments))
    assert len(client.diagnostics[uri]) == found["diagnostics"] >= 1
    close_document(client, client.root / "util.py")


@SHARED
async def test_write_tests_extends_an_existing_test_file(shared_each_kind):
    client = shared_each_kind
    existing = "from util import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    (client.root / "tests").mkdir()
    (client.root / "tests" / "test_util.py").write_text(existing, encoding="utf-8")
    uri = open_document(client, client.root / "util.py")
    rng = types.Range(start=types.Position(4, 4), end=types.Position(4, 4))  # inside add
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), range=rng,
        context=types.CodeActionContext(diagnostics=[])))
    action = next(a for a in actions if a.data["action"] == "tests")
    resolved = await client.code_action_resolve_async(action)
    (change,) = resolved.edit.document_changes  # no CreateFile: the file exists
    assert change.text_document.uri == (client.root / "tests" / "test_util.py").as_uri()
    extended = apply_edits(existing, change.edits, client.init_result.capabilities.position_encoding)
    assert extended.startswith(existing)
    tests = [n.name for n in ast.parse(extended).body if isinstance(n, ast.FunctionDef)]
    assert tests[0] == "test_add" and len(tests) >= 2 and len(set(tests)) == len(tests)
    close_document(client, client.root / "util.py")
    shutil.rmtree(client.root / "tests")  # the module's workspace as it was


@SHARED
async def test_an_edit_names_the_document_as_the_editor_spelled_its_uri(shared_each_kind):
    """Neovim leaves `(`, `)` and `+` unescaped in a file URI; an edit re-spelled (`%28...%2B`) would name no
    open buffer and carry no version, so the editor could apply it to a stale text."""
    client = shared_each_kind
    path = client.root / "a(1)+b.py"
    path.write_text("def double(x):\n    return 2 * x\n", encoding="utf-8")
    uri = "file://" + str(path)
    assert uri != path.as_uri()  # the spelling differs from Python's (and the server's) own
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=3, text=path.read_text(encoding="utf-8"))))
    try:
        rng = types.Range(start=types.Position(1, 4), end=types.Position(1, 4))
        actions = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=rng,
            context=types.CodeActionContext(diagnostics=[])))
        resolved = await client.code_action_resolve_async(next(a for a in actions if a.data["action"] == "docstring"))
        (change,) = resolved.edit.document_changes
        assert change.text_document.uri == uri and change.text_document.version == 3
    finally:
        client.text_document_did_close(types.DidCloseTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        path.unlink()


@SHARED
async def test_no_code_actions_for_documents_codectx_does_not_read(shared_each_kind, tmp_path):
    """Every action was offered for untitled:, git: and outside-workspace documents, and each then failed."""
    client = shared_each_kind
    outside = tmp_path / "elsewhere.py"
    outside.write_text("def f():\n    return 1\n", encoding="utf-8")
    rng = types.Range(start=types.Position(0, 0), end=types.Position(0, 3))
    for uri in ("untitled:Untitled-1", (client.root / "util.py").as_uri().replace("file:", "git:", 1),
                outside.as_uri(), (client.root / ".env").as_uri()):
        actions = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=rng,
            context=types.CodeActionContext(diagnostics=[])))
        assert not actions, uri  # (an empty list arrives as an empty tuple)


@SHARED
async def test_write_tests_offers_no_edit_through_a_link_out_of_the_workspace(shared_each_kind, tmp_path):
    client = shared_each_kind
    os.symlink(tmp_path, client.root / "tests")  # a repository's tests/ leading elsewhere
    try:
        uri = open_document(client, client.root / "util.py")
        rng = types.Range(start=types.Position(4, 4), end=types.Position(4, 4))
        actions = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=rng,
            context=types.CodeActionContext(diagnostics=[])))
        action = next(a for a in actions if a.data["action"] == "tests")
        with pytest.raises(JsonRpcException, match="proposes no edit to tests/test_util.py: symlink outside workspace"):
            await client.code_action_resolve_async(action)
        close_document(client, client.root / "util.py")
    finally:
        (client.root / "tests").unlink()
    assert list(tmp_path.iterdir()) == []


async def test_hover_positions_in_utf32(raw_client, tiny_model):
    capabilities = client_capabilities("visual-studio-code")
    capabilities.general.position_encodings = ["utf-32"]
    raw_client.init_result = await raw_client.initialize_session(types.InitializeParams(
        capabilities=capabilities, root_uri=raw_client.root.as_uri(),
        initialization_options=default_options(tiny_model)))
    assert raw_client.init_result.capabilities.position_encoding == "utf-32"
    await command(raw_client, "codectx.ask", question="hi", maxTokens=1)
    uri = open_document(raw_client, raw_client.root / "main.py")
    line = (raw_client.root / "main.py").read_text(encoding="utf-8").splitlines()[ADD_LINE]
    column = line.index("add(")  # code points: "café" counts 4
    result = await hover(raw_client, uri, types.Position(ADD_LINE, column + 1))
    assert result.contents.value.startswith("**add**")
    assert (result.range.start.character, result.range.end.character) == (column, column + 3)


@SHARED
async def test_find_bugs_publishes_diagnostics_cleared_on_change(shared_each_kind):
    client = shared_each_kind
    uri = open_document(client, client.root / "util.py")
    rng = {"start": {"line": 3, "character": 0}, "end": {"line": 6, "character": 0}}
    result = await command(client, "codectx.findBugs", uri=uri, range=rng)
    assert result["diagnostics"] >= 1
    diagnostics = client.diagnostics[uri]
    assert len(diagnostics) == result["diagnostics"] and {d.source for d in diagnostics} == {"codectx"}
    assert all(3 <= d.range.start.line <= 5 for d in diagnostics)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="#\n")]))
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert list(client.diagnostics[uri]) == []
    close_document(client, client.root / "util.py")


async def test_hover_right_after_an_edit_reads_the_warm_prefix(tiny_model, workspace):
    """In process: a hover right after an edit restores the whole warm prefix."""
    host = await loaded_host(default_options(tiny_model), workspace)
    session = host.ready_now()
    try:
        await ask_feature.ask(session, "hi", on_text=lambda text: None,
                              max_tokens=1)  # prefills the prefix
        warm = status_feature.show_context(session, session.prompt.layout(), session.warmup.segment_states())
        warm_tokens = sum(row["tokens"] for row in warm["segments"])
        edit_buffer(host, workspace / "util.py", 2, 0, "# edited, not prefilled yet\n")
        edited = status_feature.show_context(session, session.prompt.layout(), session.warmup.segment_states())
        assert {row["cache"] for row in edited["segments"]} != {"cached"}
        answer = await explain(session, "greet", workspace / "util.py")  # `def greet`, one line lower now
        assert answer.source == "model"
        metrics, last = session.counters.last_metrics, session.counters.last_hover
        # The whole warm prefix was restored; only the hover lead-in and answer start were prefilled.
        assert metrics["cached_tokens"] == warm_tokens
        assert metrics["recomputed_tokens"] == last["promptTokens"] - warm_tokens
        assert last["headTokens"] > 8  # greet's current text is quoted (and only then its name)
    finally:
        host.close()
