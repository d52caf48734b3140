"""The model's tools read only what the workspace's access policy admits, and bad calls never end an ask.

The tools are built as the server builds them (`WorkspaceTools` over the real `AccessPolicy`
of a real git work tree, the session's `read_text`, the prefix's files). The ask loop runs
with the scripted engine of tests/server/scripted.py: a named stand-in for model output,
since the tiny test model cannot produce tool calls. Everything else is the real code.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from lsprotocol import types

from server.core.features.ask import ask
from server.core.tools import MAX_ERROR_CHARS, ToolCall, ToolError, WorkspaceTools, parse_tool_call
from tests.server.harness import write_sample_workspace
from tests.server.scripted import ByteTokenizer, session_for

SECRET = "S3CRET-"  # every secret file's text starts with it; no prompt may carry it
HUGE_BYTES = 200 << 20


def _git(root, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path):
    """A git work tree with secrets, ignored files, a FIFO, a 200 MB sparse file and a link out."""
    outside = tmp_path / "outside.py"
    outside.write_text(f"{SECRET}outside = 1\n", encoding="utf-8")
    root = tmp_path / "repo"
    root.mkdir()
    write_sample_workspace(root)
    _git(root, "init", "-q")
    _git(root, "config", "secret.token", f"{SECRET}gitconfig")
    for name in (".env", ".env.local", "id_rsa", "ignored.py", "build.log", "legacy.py"):
        (root / name).write_text(f"{SECRET}{name} = 1\n", encoding="utf-8")
    (root / "legacy.py").write_text("LEGACY = 'tracked, then ignored'\n", encoding="utf-8")
    (root / ".gitignore").write_text("ignored.py\n*.log\n", encoding="utf-8")
    _git(root, "add", "util.py", "main.py", ".gitignore", "legacy.py")
    (root / ".gitignore").write_text("ignored.py\n*.log\nlegacy.py\n", encoding="utf-8")
    os.mkfifo(root / "pipe.py")
    with open(root / "huge.py", "wb") as f:
        f.truncate(HUGE_BYTES)  # sparse: 200 MB long, nothing on disk
    os.symlink(outside, root / "link.py")
    return root


# (arguments of read_file, text the tool error must contain)
REFUSED = [
    ({"path": ".env"}, "secret (deny list)"),
    ({"path": ".env.local"}, "secret (deny list)"),
    ({"path": "id_rsa"}, "secret (deny list)"),
    ({"path": ".git/config"}, "git metadata"),
    ({"path": "ignored.py"}, "ignored"),
    ({"path": "build.log"}, "ignored"),
    ({"path": "../outside.py"}, "outside the workspace"),
    ({"path": "util.py/../../outside.py"}, "outside the workspace"),
    ({"path": "/etc/passwd"}, "outside the workspace"),
    ({"path": "/proc/self/environ"}, "outside the workspace"),
    ({"path": "util.py\0.env"}, "not a file name"),
    ({"path": "\ud800.py"}, "not a file name"),
    ({"path": ""}, "not a file name"),
    ({"path": "x" * 100_000}, "unreadable (File name too long)"),
    ({"path": "d/" * 3000 + "x.py"}, "unreadable (File name too long)"),
    ({"path": None}, "must be a string"),
    ({"path": ["util.py"]}, "must be a string"),
    ({"path": {"path": "util.py"}}, "must be a string"),
    ({"path": 7}, "must be a string"),
    ({}, "bad arguments"),
    ({"path": "util.py", "mode": "w"}, "bad arguments"),
    ({"path": "util.py", "start_line": -3}, "numbered from 1"),
    ({"path": "util.py", "start_line": 0}, "numbered from 1"),
    ({"path": "util.py", "start_line": 5, "end_line": -1}, "numbered from 1"),
    ({"path": "util.py", "start_line": 10 ** 30}, "past its end"),
    ({"path": "util.py", "start_line": "4"}, "must be an integer"),
    ({"path": "util.py", "start_line": True}, "must be an integer"),
    ({"path": "util.py", "start_line": 1.5}, "must be an integer"),
    ({"path": "pipe.py"}, "not a regular file (a FIFO)"),
    ({"path": "huge.py"}, f"too large ({HUGE_BYTES} bytes)"),
    ({"path": "link.py"}, "symlink outside workspace"),
    ({"path": "."}, "outside the workspace"),
]


def tools_of(session) -> WorkspaceTools:
    """The tools exactly as the server builds them once the model is loaded (server/lsp/app.py)."""
    return WorkspaceTools(session.prompt.access, session.read_text, lambda: session.prompt.files)


@pytest.mark.parametrize("arguments,reason", REFUSED, ids=[f"{i}-{r[:18]}" for i, (_, r) in enumerate(REFUSED)])
def test_read_file_refuses_with_a_reason(repo, arguments, reason):
    session, _ = session_for(repo, ["unused"])
    started = time.monotonic()
    with pytest.raises(ToolError) as raised:
        tools_of(session).run(ToolCall("read_file", arguments))
    message = str(raised.value)
    assert reason in message and SECRET not in message
    assert len(message) <= MAX_ERROR_CHARS + len(" [truncated]")
    assert time.monotonic() - started < 2.0  # nothing read whole: not the FIFO, not 200 MB
    assert tools_of(session).run(ToolCall("read_file", {"path": "util.py", "start_line": 4, "end_line": 4})) == \
        "4: def add(a, b):"


def test_allowed_files_and_searches_never_reach_secrets(repo):
    session, _ = session_for(repo, ["unused"])
    tools = tools_of(session)
    assert tools.run(ToolCall("read_file", {"path": "legacy.py"})) == "1: LEGACY = 'tracked, then ignored'"
    assert tools.run(ToolCall("read_file", {"path": str(repo / "util.py"), "start_line": 5})).startswith("5: ")
    assert tools.run(ToolCall("search", {"text": SECRET})) == f"no line contains {SECRET!r}"
    assert tools.run(ToolCall("find_definition", {"name": "add"})) == "util.py:4: def add(a, b):"
    # An editor that opened .env does not open it to the tools.
    session.documents.open(types.TextDocumentItem(uri=(repo / ".env").as_uri(), language_id="dotenv", version=1,
                                                  text=f"{SECRET}buffer\n"))
    with pytest.raises(ToolError, match="secret"):
        tools.run(ToolCall("read_file", {"path": ".env"}))


@pytest.mark.parametrize("body", ['{"name": "read_file", "arguments": {"start_line": ' + "9" * 5000 + "}}",
                                  "[" * 100_000, '{"name": ' + '"x' * 300_000 + "}", "\ud800"],
                         ids=["5000-digit-int", "nested-100k", "long-garbage", "surrogate"])
def test_unparsable_calls_are_tool_errors(body):
    with pytest.raises(ToolError) as raised:
        parse_tool_call(f"<tool_call>{body}</tool_call>")
    assert len(str(raised.value)) <= MAX_ERROR_CHARS + len(" [truncated]")


async def test_ask_loop_survives_every_bad_call_and_leaks_nothing(repo):
    calls = [f'<tool_call>{json.dumps({"name": "read_file", "arguments": a})}</tool_call>' for a, _ in REFUSED]
    calls += ['<tool_call>{"name": "run_shell", "arguments": {"cmd": "cat .env"}}</tool_call>',
              '<tool_call>{"name": "search", "arguments": {"text": "' + SECRET + '"}}</tool_call>']
    session, engine = session_for(repo, [*calls, "done reading."], ask={"maxToolCalls": len(calls)})
    # Byte tokens, and one call alone names a 100,000-character path: a context that holds every round.
    session.backend.context_length = 262144
    result = await ask(session, "Read every secret.", on_text=lambda t: None,
                       tools=tools_of(session))
    assert result.finish_reason == "stop" and result.text.endswith("done reading. ")
    assert len(result.tool_calls) == len(calls) and len(engine.requests) == len(calls) + 1
    prompts = [ByteTokenizer().decode(r.all_token_ids()) for r in engine.requests]
    last = prompts[-1]
    responses = last.split("<tool_response>\n")[1:]
    assert len(responses) == len(calls)
    for response, (_, reason) in zip(responses, REFUSED):
        assert response.startswith("error: ") and reason in response.split("\n</tool_response>")[0]
    assert responses[-2].startswith("error: unknown tool 'run_shell'")
    assert responses[-1].startswith(f"no line contains {SECRET!r}")
    assert not any(SECRET + name in prompt for prompt in prompts
                   for name in (".env", ".env.local", "id_rsa", "ignored.py", "build.log", "gitconfig", "outside"))
    # The same session answers the next question normally.
    again = await ask(session, "What does add do?", on_text=lambda t: None)
    assert again.finish_reason == "stop"


async def test_ask_with_an_unparsable_call_answers(repo):
    huge = '<tool_call>{"name": "read_file", "arguments": {"start_line": ' + "9" * 5000 + '}}</tool_call>'
    session, engine = session_for(repo, [huge, "not reached"])
    result = await ask(session, "Read it.", on_text=lambda t: None,
                       tools=tools_of(session))
    assert result.finish_reason == "stop" and result.tool_calls == [] and len(engine.requests) == 1


def test_tools_of_a_workspace_opened_through_a_symlinked_folder(repo):
    alias = repo.parent / "alias"
    os.symlink(repo, alias)
    session, _ = session_for(alias, ["unused"])
    tools = tools_of(session)
    assert tools.run(ToolCall("search", {"text": "def add"})) == "util.py:4: def add(a, b):"
    assert tools.run(ToolCall("read_file", {"path": str(alias / "util.py"), "start_line": 4, "end_line": 4})) == \
        "4: def add(a, b):"
    with pytest.raises(ToolError, match="symlink outside workspace"):
        tools.run(ToolCall("read_file", {"path": str(alias / "link.py")}))
