"""Links, secrets and paths outside the workspace never reach the prompt, whatever event names them.

The old build read a path named by `workspace/didChangeWatchedFiles` (and on didClose) from
disk as it was, so `notes.py -> /outside/secret.py` put the outside file into the prompt.
These tests drive the real language server: they create such links, send the file events
and document notifications an editor would send, and read the prefix back with
`codectx.showContext` (every file segment, its tokens, and every skip with its reason).
The in-process tests check the segment texts themselves.
"""
from __future__ import annotations

import os
import subprocess

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from context.scan import Skipped
from context.workspace import Workspace
from server.lsp.errors import CONTEXT_FAILED
from tests.security.lsp_session import (ask, did_close, did_open, did_save, file_event, hover, prefix_tokens,
                                        prompt_keys, served, show_context, skip_reasons)
from tests.server.harness import command, write_sample_workspace
from tests.server.scripted import ByteTokenizer

SECRET = "S3CRET-"
OUTSIDE_TEXT = f"TOKEN = '{SECRET}outside'\n"
CREATED, CHANGED = types.FileChangeType.Created, types.FileChangeType.Changed


@pytest.fixture()
def layout(tmp_path):
    """(workspace, outside folder): a sample workspace with a .env, and secrets next to it."""
    outside = tmp_path / "outside"
    (outside / "pkg").mkdir(parents=True)
    (outside / "secret.py").write_text(OUTSIDE_TEXT, encoding="utf-8")
    (outside / "pkg" / "deep.py").write_text(f"DEEP = '{SECRET}deep'\n", encoding="utf-8")
    (tmp_path / "ws").mkdir()
    root = write_sample_workspace(tmp_path / "ws")
    (root / ".env").write_text(f"API_KEY={SECRET}env\n", encoding="utf-8")
    (root / "real.py").write_text("REAL = 1\n", encoding="utf-8")
    return root, outside


def plant_links(root, outside) -> dict[str, str]:
    """Links an attacker can commit or create; returns path -> the reason the policy must give."""
    os.symlink(outside / "secret.py", root / "notes.py")
    os.symlink(".env", root / "env_link.py")
    os.symlink(outside / "pkg", root / "linked")
    os.symlink(root / "env_link.py", root / "chain.py")  # a link to a link to .env
    return {"notes.py": "symlink outside workspace", "env_link.py": "symlink to .env: secret (deny list)",
            "linked/deep.py": "symlink outside workspace", "chain.py": "symlink to .env: secret (deny list)"}


async def test_file_events_and_buffers_for_links_leave_the_prompt_unchanged(layout):
    root, outside = layout
    async with served(root) as client:
        before = await show_context(client)
        assert prompt_keys(before) == {"util.py", "main.py", "real.py"}
        assert skip_reasons(before) == {".env": "secret (deny list)"}

        expected = plant_links(root, outside)
        events = [file_event(root / p) for p in expected] + [
            file_event(root / ".env", CHANGED), file_event(outside / "secret.py", CHANGED),
            types.FileEvent(uri=(root / "..").as_uri() + "/outside/secret.py", type=CREATED)]
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=events))
        after_events = await show_context(client)
        assert prompt_keys(after_events) == prompt_keys(before)
        assert prefix_tokens(after_events) == prefix_tokens(before)  # not one token came in
        reasons = skip_reasons(after_events)
        assert {p: reasons.get(p) for p in expected} == expected and reasons[".env"] == "secret (deny list)"

        # An editor opens the links (it read the outside text through them), saves and closes them.
        for rel in expected:
            did_open(client, root / rel, OUTSIDE_TEXT)
        for rel in expected:
            did_save(client, root / rel, OUTSIDE_TEXT)
        opened = await show_context(client)
        assert prompt_keys(opened) == prompt_keys(before) and prefix_tokens(opened) == prefix_tokens(before)
        assert await hover(client, root / "notes.py", 0, 1) is None  # refused quietly, no error popup
        for rel in expected:
            did_close(client, root / rel)
        closed = await show_context(client)
        assert prompt_keys(closed) == prompt_keys(before) and prefix_tokens(closed) == prefix_tokens(before)
        assert {p: skip_reasons(closed).get(p) for p in expected} == expected

        # A kept file swapped for a link out: its text leaves the prompt (a deletion note), the secret stays out.
        (root / "real.py").unlink()
        os.symlink(outside / "secret.py", root / "real.py")
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
            changes=[file_event(root / "real.py", CHANGED)]))
        swapped = await show_context(client)
        assert skip_reasons(swapped)["real.py"] == "symlink outside workspace"
        hot = [row for row in swapped["segments"] if row["kind"] == "hot"]
        assert [(row["key"], row["reason"]) for row in hot] == [("real.py", "hot (deleted)")]

        await ask(client)  # the server still answers normally
        await ask(client, "What is \ud800 in util.py?")  # a lone surrogate from JSON reaches no tokenizer
        main = root / "main.py"
        did_open(client, main, main.read_text(encoding="utf-8"))
        answer = await hover(client, main, 4, main.read_text(encoding="utf-8").splitlines()[4].index("add(") + 1)
        assert answer is not None and "**add**" in answer.contents.value


def segment_texts(ws: Workspace) -> str:
    return "".join(s.text for s in ws.layout.segments)


def test_reload_and_buffers_keep_link_targets_out_of_the_segments(layout):
    root, outside = layout
    ws = Workspace(root, ByteTokenizer(), persist=False)
    ws.build()
    expected = plant_links(root, outside)
    for rel in expected:
        ws.reload(rel)
        ws.update(rel, OUTSIDE_TEXT)  # an editor buffer of the link
        ws.reload(rel)  # closed again
    ws.reload(".env")
    texts = segment_texts(ws)
    assert SECRET not in texts and "REAL = 1" in texts
    assert {s.path: s.reason for s in ws.layout.skipped if s.path in expected} == expected
    ws.build(fold=True)  # a full rebuild (reindex) lists and reads everything again
    assert SECRET not in segment_texts(ws)
    rebuilt = {s.path: s.reason for s in ws.layout.skipped}
    assert rebuilt["linked/"] == "symlinked folder (not followed)" and "linked/deep.py" not in rebuilt
    assert {p: rebuilt[p] for p in ("notes.py", "env_link.py", "chain.py")} == \
        {p: expected[p] for p in ("notes.py", "env_link.py", "chain.py")}


def test_committed_links_in_a_git_work_tree_are_refused(layout):
    root, outside = layout
    expected = plant_links(root, outside)
    subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)  # links are committed as links
    ws = Workspace(root, ByteTokenizer(), persist=False)
    ws.build()
    skipped = {s.path: s.reason for s in ws.layout.skipped}
    assert SECRET not in segment_texts(ws)
    assert skipped["notes.py"] == expected["notes.py"] and skipped["env_link.py"] == expected["env_link.py"]
    assert skipped["linked"] == "symlink outside workspace"  # git lists a folder link as one entry
    assert skipped[".env"] == "secret (deny list)" and skipped[".git/"] == "git metadata (never read)"
    assert {row.path for row in ws.layout.rows} == {"util.py", "main.py", "real.py"}


async def test_an_invalid_deny_setting_is_a_clear_error_not_an_open_door(layout):
    root, _ = layout
    async with served(root, context={"deny": ["[z-a]"]}) as client:
        with pytest.raises(JsonRpcException, match=r"invalid deny pattern in \['\[z-a\]'\]") as failed:
            await show_context(client)
        assert failed.value.code == CONTEXT_FAILED
        status = await command(client, "codectx.status")
        assert status["ready"] is False and status["prefixVersion"] == 0


def test_events_under_git_metadata_and_for_gone_secrets_do_not_pile_up(layout):
    """Editors report every write under .git/ (objects, index, logs): each used to add a skip row."""
    root, _ = layout
    subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    ws = Workspace(root, ByteTokenizer(), persist=False)
    before = ws.build().skipped
    assert {s.path for s in before} == {".git/", ".env"}
    for n in range(300):
        ws.reload(f".git/objects/{n % 256:02x}/{n:038x}")
        ws.reload(f".env.{n}")  # a secret that is gone (a Deleted event)
    ws.reload(".git/index")
    assert ws.layout.skipped == before and SECRET not in segment_texts(ws)
    ws.update(".git/config", "[core]\n\tfsmonitor = evil\n")  # an editor buffer of git metadata: refused, listed
    assert ws.layout.skipped == (*before, Skipped(".git/config", "git metadata (never read)"))
    assert "fsmonitor" not in segment_texts(ws)
    assert {row.path for row in ws.layout.rows} == {"util.py", "main.py", "real.py"}


async def test_a_workspace_opened_through_a_symlinked_folder_keeps_working(layout):
    """Editors send paths under the folder the user opened (macOS /tmp is /private/tmp): those
    paths are inside; links out of the workspace are still refused."""
    root, outside = layout
    alias = root.parent / "alias"
    os.symlink(root, alias)
    async with served(alias) as client:
        before = await show_context(client)
        (alias / "extra.py").write_text("def extra():\n    return 2\n", encoding="utf-8")
        os.symlink(outside / "secret.py", alias / "notes.py")
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
            changes=[file_event(alias / "extra.py"), file_event(alias / "notes.py")]))
        util = alias / "util.py"
        did_open(client, util, util.read_text(encoding="utf-8") + "\n\ndef more():\n    return 3\n")
        after = await show_context(client)
        assert prompt_keys(after) == prompt_keys(before) | {"extra.py"}
        assert [row["key"] for row in after["segments"] if row["kind"] == "hot"] == ["extra.py", "util.py"]
        assert skip_reasons(after)["notes.py"] == "symlink outside workspace"
        main = alias / "main.py"
        did_open(client, main, main.read_text(encoding="utf-8"))
        answer = await hover(client, main, 4, main.read_text(encoding="utf-8").splitlines()[4].index("add(") + 1)
        assert answer is not None and "**add**" in answer.contents.value
        await ask(client)


async def test_a_buffer_under_a_relative_file_uri_stands_for_no_workspace_file(layout):
    """`file:util.py` has no absolute path: read against the root it would have replaced `util.py` in the
    prompt with the buffer's text. Such a buffer names no file: the prefix stays as it was, hover is quiet."""
    root, _ = layout
    async with served(root) as client:
        before = await show_context(client)
        for uri in ("file:util.py", "file:///C:/ws/util.py"):
            client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=OUTSIDE_TEXT)))
            after = await show_context(client)
            assert prompt_keys(after) == prompt_keys(before) and prefix_tokens(after) == prefix_tokens(before)
            answer = await client.text_document_hover_async(types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(0, 1)))
            assert answer is None


def test_a_link_the_process_may_not_resolve_is_skipped_not_fatal(tmp_path):
    """A root of `/` (a Neovim started there) holds /proc/1/cwd, whose target the process may not
    read: `os.path.realpath` raised PermissionError out of the scan, and every request failed.
    The link here points at /proc/1/cwd too; where this process may read it, the symlink is
    refused as pointing outside (the same outcome: skipped, and the scan goes on)."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "main.py").write_text("x = 1\n", encoding="utf-8")
    (root / "proc_link").symlink_to("/proc/1/cwd")
    try:
        os.path.realpath(root / "proc_link")
        expected = "symlink outside workspace"
    except PermissionError:
        expected = "unreadable (Permission denied)"
    ws = Workspace(root, ByteTokenizer(), persist=False)
    ws.build()
    assert {s.path: s.reason for s in ws.layout.skipped}.get("proc_link") == expected
    assert ws.access.read("proc_link") == Skipped("proc_link", expected)
    assert "x = 1" in segment_texts(ws)
