"""Focus segments through the core and the CLI: an ask about code that is not in the stable
prefix gets its definition after the prefix, and the prefix stays warm whatever the question."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from context.focus_query import FocusQuery
from engine.request import SegmentKind, stable_part
from tests.context.focus_repo import write_repo
from tests.server.harness import REPO_ROOT, build_server_test_model, default_options, in_process_session

QUESTION = "What does preload() in pkg/blas.py do?"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_server_test_model(tmp_path_factory.mktemp("focus-model"))


@pytest.fixture
def repo(tmp_path) -> Path:
    return write_repo(tmp_path / "repo")


async def test_ask_focuses_a_named_definition_and_keeps_the_prefix_warm(model, repo):
    from server.core.features.ask import ask
    from server.core.prompt import Turn

    session = await in_process_session(default_options(model, context={"budgetTokens": 1200},
                                                       focus={"budgetTokens": 400}), repo)
    try:
        layout = session.prompt.workspace.layout
        assert "pkg/blas.py" not in {s.key for s in layout.segments}  # not in the stable prefix
        result = await ask(session, QUESTION, on_text=lambda _t: None)
        first = result.focus["items"][0]
        assert (first["path"], first["name"], first["lines"]) == ("pkg/blas.py", "preload", [4, 7])
        assert first["reason"] == "named in the question (preload())" and result.focus["tokens"] <= 400
        focus = session.prompt.focus(FocusQuery(QUESTION), 400)
        asked = session.prompt.segments([Turn("user", QUESTION)], focus.segments)
        assert "def preload(path=None):" in asked[len(layout.segments)].text
        assert asked[len(layout.segments)].kind == SegmentKind.FOCUS
        other_q = "Explain clamp() in small.py"
        other = session.prompt.focus(FocusQuery(other_q), 400)
        assert other.items and other.segments != focus.segments
        other_prompt = session.prompt.segments([Turn("user", other_q)], other.segments)
        assert stable_part(other_prompt) == stable_part(asked) == list(layout.segments)
        stable_tokens, focus_tokens = layout.tokens, focus.tokens
        # the ask left the stable prefix and its focus at checkpoints: the same focus restores,
        # another question's focus costs only its own tokens
        assert session.backend.probe(asked).warm_tokens >= stable_tokens + focus_tokens
        probe = session.backend.probe(other_prompt)
        assert stable_tokens <= probe.warm_tokens < stable_tokens + other.tokens
        again = await ask(session, "And `_open`?", on_text=lambda _t: None)  # still answers
        assert again.focus["items"][0]["name"] == "_open" and again.finish_reason in ("stop", "length")
    finally:
        session.close()


async def test_focus_off(model, repo):
    from server.core.features.ask import ask

    session = await in_process_session(default_options(model, context={"budgetTokens": 1200},
                                                       focus={"enabled": False}), repo)
    try:
        result = await ask(session, QUESTION, on_text=lambda _t: None)
        assert result.focus is None and result.finish_reason in ("stop", "length")
    finally:
        session.close()


def test_context_command_shows_the_focus(model, repo, tmp_path):
    env = dict(os.environ, CODECTX_HOME=str(tmp_path / "home"))
    args = [sys.executable, "-m", "server.cli", "context", "--repo", str(repo), "--tokenizer", str(model),
            "--budget", "1200", "--question", QUESTION]
    table = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert table.returncode == 0, table.stderr
    assert "pkg/blas.py:4-7 preload" in table.stdout and "named in the question (preload())" in table.stdout
    as_json = subprocess.run(args + ["--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)
    focus = json.loads(as_json.stdout)["focus"]
    assert focus["items"][0]["name"] == "preload" and 0 < focus["tokens"] <= focus["budget"] == 1024


async def test_http_beside_the_editor_gets_the_focus(model, repo):
    from server.http.source import SessionSource
    from tests.server.harness import loaded_host

    host = await loaded_host(default_options(model, context={"budgetTokens": 1200}), repo)
    try:
        segments = await SessionSource(host).repository_segments([("user", QUESTION)])
        focused = [s for s in segments if s.kind == SegmentKind.FOCUS]
        assert focused and focused[0].key == "pkg/blas.py:4-7" and "def preload(" in focused[0].text
        assert stable_part(segments) == list(host.current().prompt.workspace.layout.segments)
    finally:
        host.close()


def test_cli_ask_names_a_definition_and_gets_it(model, repo, tmp_path):
    env = dict(os.environ, CODECTX_HOME=str(tmp_path / "home"))
    result = subprocess.run([sys.executable, "-m", "server.cli", "ask", "--repo", str(repo), "--model", str(model),
                             "--max-tokens", "3", QUESTION], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "[focus: pkg/blas.py:4-7 preload (" in result.stderr, result.stderr


async def test_http_standalone_repository_model_gets_the_focus(model, repo):
    import asyncio

    from server.core.settings import parse_settings
    from server.http.source import StandaloneSource

    settings, _ = parse_settings(default_options(model, context={"budgetTokens": 1200}))
    source = await asyncio.to_thread(StandaloneSource.start, str(model), workspace=repo, settings=settings)
    try:
        segments = await source.repository_segments([("user", QUESTION)])
        focused = [s for s in segments if s.kind == SegmentKind.FOCUS]
        assert [s.key for s in focused][:1] == ["pkg/blas.py:4-7"]
        assert stable_part(segments) == list(source.prompt.workspace.layout.segments)
    finally:
        source.close()
