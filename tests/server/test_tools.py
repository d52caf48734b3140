"""Read-only workspace tools and the ask loop that runs them (scripted model output)."""
from __future__ import annotations

import os

import pytest

from context.access import AccessPolicy
from server.core.features.ask import ask
from server.core.tools import MAX_RESULT_CHARS, ToolCall, ToolError, WorkspaceTools, parse_tool_call
from tests.server.harness import write_sample_workspace
from tests.server.scripted import ByteTokenizer, session_for


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    write_sample_workspace(root)
    (tmp_path / "secret.txt").write_text("do not read", encoding="utf-8")
    return root


def tools_for(root) -> WorkspaceTools:
    files = sorted(p for p in root.rglob("*.py"))
    access = AccessPolicy(root)
    return WorkspaceTools(access, access.read_text, lambda: files)


def test_parse_tool_call_variants():
    assert parse_tool_call("no call here") is None
    call = parse_tool_call('I will look. <tool_call>{"name": "search", "arguments": {"text": "add"}}</tool_call>')
    assert call == ToolCall("search", {"text": "add"})
    assert parse_tool_call('<tool_call>{"name": "search"}') == ToolCall("search", {})  # stopped at the close tag
    with pytest.raises(ToolError):
        parse_tool_call("<tool_call>{not json}</tool_call>")
    with pytest.raises(ToolError):
        parse_tool_call('<tool_call>{"arguments": {}}</tool_call>')


def test_tools_read_find_and_search(repo):
    tools = tools_for(repo)
    assert tools.run(ToolCall("read_file", {"path": "util.py", "start_line": 4, "end_line": 5})) == \
        '4: def add(a, b):\n5:     """Returns a + b."""'
    assert tools.run(ToolCall("find_definition", {"name": "greet"})) == "util.py:9: def greet(name: str) -> str:"
    assert "main.py:1: from util import add, greet" in tools.run(ToolCall("search", {"text": "import add"}))


def test_tools_stay_inside_the_workspace(repo):
    tools = tools_for(repo)
    with pytest.raises(ToolError, match="inside the workspace"):
        tools.run(ToolCall("read_file", {"path": "../secret.txt"}))
    os.symlink(repo.parent / "secret.txt", repo / "link.txt")
    with pytest.raises(ToolError, match="inside the workspace"):
        tools.run(ToolCall("read_file", {"path": "link.txt"}))
    with pytest.raises(ToolError, match="unknown tool"):
        tools.run(ToolCall("run_shell", {"cmd": "ls"}))
    with pytest.raises(ToolError, match="bad arguments"):
        tools.run(ToolCall("search", {"pattern": "x"}))


def test_tool_results_are_capped(repo):
    (repo / "big.py").write_text("x = 1\n" * 5000, encoding="utf-8")
    result = tools_for(repo).run(ToolCall("read_file", {"path": "big.py"}))
    assert len(result) <= MAX_RESULT_CHARS + len("\n[truncated]") and result.endswith("[truncated]")


async def test_ask_runs_a_tool_and_continues(repo):
    call = '<tool_call>{"name": "read_file", "arguments": {"path": "util.py", "start_line": 4, "end_line": 6}}</tool_call>'
    session, engine = session_for(repo, [call, "add returns the sum."])
    pieces = []
    result = await ask(session, "What does add do?", on_text=pieces.append,
                       tools=tools_for(repo))
    assert result.text == "".join(pieces)
    assert "[tool read_file returned" in result.text and result.text.endswith("add returns the sum. ")
    assert result.tool_calls == [{"name": "read_file", "arguments": {"path": "util.py", "start_line": 4, "end_line": 6},
                                  "resultChars": len('4: def add(a, b):\n5:     """Returns a + b."""\n6:     return a + b')}]
    second_prompt = ByteTokenizer().decode(engine.requests[1].all_token_ids())
    assert "<tool_response>\n4: def add(a, b):" in second_prompt and call in second_prompt
    assert engine.requests[0].stop == ("</tool_call>",)
    assert result.metrics["rounds"] == 2


async def test_ask_stops_after_max_tool_calls_and_reports_errors(repo):
    call = '<tool_call>{"name": "read_file", "arguments": {"path": "../secret.txt"}}</tool_call>'
    session, engine = session_for(repo, [call], ask={"maxToolCalls": 2})
    result = await ask(session, "Read the secret", on_text=lambda t: None,
                       tools=tools_for(repo))
    assert len(engine.requests) == 3 and len(result.tool_calls) == 2
    last_prompt = ByteTokenizer().decode(engine.requests[-1].all_token_ids())
    assert "error: '../secret.txt' is not a file inside the workspace" in last_prompt
    assert "do not read" not in last_prompt


async def test_conversation_turns_carry_over(repo):
    session, engine = session_for(repo, ["first answer", "second answer"])
    first = await ask(session, "Q1", on_text=lambda t: None)
    await ask(session, "Q2", on_text=lambda t: None, conversation_id=first.conversation_id)
    prompt = ByteTokenizer().decode(engine.requests[1].all_token_ids())
    assert prompt.index("Q1") < prompt.index("first answer") < prompt.index("Q2")
