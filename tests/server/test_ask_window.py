"""`codectx ask --window G,W[,TAIL]` / `--no-approximation`: parsing and an end-to-end answer."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.ask_cmd import window_settings
from server.core.prompt import Turn, WorkspacePrompt
from server.core.settings import ContextSettings
from server.core.tools import TOOLS_PROMPT
from tests.engine.tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def test_window_flag_parsing():
    assert window_settings(None, enabled=False).enabled is False
    default = window_settings(None)
    assert default.enabled and (default.global_tokens, default.window_tokens) == (8192, 8192)
    p = window_settings("16,32")
    assert (p.global_tokens, p.window_tokens, p.dense_tail_tokens) == (16, 32, default.dense_tail_tokens)
    assert window_settings("16,32,8").dense_tail_tokens == 8
    for bad in ("16", "16,32,8,4", "a,b", "-1,4"):
        with pytest.raises(ValueError):
            window_settings(bad)


def test_ask_with_a_window_answers_like_the_windowed_engine(tmp_path_factory):
    from engine.engine import Engine
    from engine.loading import load_model
    from engine.request import Request
    from engine.window import WindowPolicy

    model_dir = build_tiny_model(tmp_path_factory.mktemp("ask-window-model"))
    repo = tmp_path_factory.mktemp("ask-window-repo")
    for i in range(6):
        (repo / f"mod{i}.py").write_text("".join(f"def f{i}_{k}(x):\n    return x * {k} + {i}\n"
                                                 for k in range(6)))
    question = "What does f3_2 return?"
    args = ["ask", "--repo", str(repo), "--model", str(model_dir), "--max-tokens", "6",
            "--window", "16,32,16", question]
    result = subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr

    loaded = load_model(str(model_dir), progress=False)
    # The server's prompt for the repository (tools, system prompt, the focus on f3_2), as the
    # CLI builds it.
    from context.focus_query import FocusQuery
    from server.core.settings import FocusSettings

    prompt = WorkspacePrompt(repo, loaded.tokenizer, lambda path: None, TOOLS_PROMPT, ContextSettings())
    turns = [Turn("user", question)]
    focus = prompt.fitted_focus(FocusQuery(question), turns, FocusSettings(), loaded.context_length, 6)
    assert focus is not None and focus.segments
    segments = prompt.segments(turns, focus.segments)
    assert prompt.workspace.layout.tokens > 16 + 32 + 16 + 64  # long enough that the window skips keys
    with Engine(loaded, window=WindowPolicy(global_tokens=16, window_tokens=32, dense_tail=16)) as eng:
        assert eng.prefix.policy.approximation
        done = eng.submit(Request(segments=segments, max_tokens=6)).result()
    assert result.stdout == done.text + "\n"
