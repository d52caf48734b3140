"""First use through the real processes: an empty question is refused with the one message
everywhere (the CLI and the language server here; HTTP in tests/http/test_first_use_http.py)."""
from __future__ import annotations

import json
import re
import socket

import pytest
from pygls.exceptions import JsonRpcException

from server.core.question import EMPTY_QUESTION
from tests.server.harness import command
from tests.server.shared_server import SHARED
from tests.server.test_cli import codectx


@pytest.mark.parametrize("question", ["", "   ", "\n\t "])
def test_cli_ask_refuses_an_empty_question(question, tmp_path):
    result = codectx("ask", "--repo", ".", question, home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"codectx ask: {EMPTY_QUESTION}"
    assert result.stdout == ""


@SHARED
@pytest.mark.parametrize("question", ["", "   "])
async def test_lsp_ask_refuses_an_empty_question(shared, question):
    with pytest.raises(JsonRpcException) as raised:
        await command(shared, "codectx.ask", question=question, maxTokens=4)
    assert raised.value.code == -32602 and EMPTY_QUESTION in raised.value.message
    result = await command(shared, "codectx.ask", question="What does add do?", maxTokens=4)
    assert result["finishReason"] in ("stop", "length") and result["metrics"]["decode_tokens"] >= 1


def _missing(tmp_path):
    return str(tmp_path / "nope")


# One kind of error, one status, whichever command meets it (server/exit_status.py, README).
SAME_CAUSE = {
    "a path that is not a folder": (2, [("ask", "--repo", "{missing}", "hi"),
                                        ("context", "--repo", "{missing}"),
                                        ("serve", "--http", "0", "--workspace", "{missing}")]),
    "a model that is not found": (2, [("ask", "--model", "{missing}", "hi"),
                                      ("serve", "--http", "0", "--model", "{missing}"),
                                      ("eval", "--model", "{missing}", "--tasks", "needle")]),
    "a bad option": (2, [("ask", "--max-tokens", "0", "hi"), ("context", "--budget", "x"),
                         ("serve", "--http", "nohost:"), ("measure", "--file", "{missing}")]),
}


@pytest.mark.parametrize("cause", list(SAME_CAUSE))
def test_one_exit_status_per_kind_of_error(cause, tmp_path):
    status, commands = SAME_CAUSE[cause]
    for argv in commands:
        result = codectx(*(a.format(missing=_missing(tmp_path)) for a in argv), home=tmp_path / "home")
        assert result.returncode == status, (argv, result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == "", argv
        assert f"codectx {argv[0]}" in result.stderr, (argv, result.stderr)


def test_a_run_that_fails_is_status_1(tmp_path):
    question = tmp_path / "q.txt"
    question.write_text("hi")
    with socket.socket() as sock:  # a port nobody serves: the server cannot be reached
        sock.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = codectx("measure", "--file", str(question), "--url", unreachable, home=tmp_path)
    assert result.returncode == 1 and "codectx measure:" in result.stderr and "Traceback" not in result.stderr


def test_context_shows_the_layout_ask_uses_and_what_fits(tmp_path):
    """Without --budget, `context` lays out with the budget `ask` uses for the model (ask also
    subtracts its question's tokens); `--budget unlimited` has every file whole."""
    from context.hf_tokenizer import HFTokenizer
    from server.core.prefix_budget import prefix_budget
    from server.core.settings import Settings
    from tests.server.harness import build_server_test_model

    model = build_server_test_model(tmp_path / "model")
    repo = tmp_path / "repo"
    repo.mkdir()
    for i in range(40):  # about 16k tokens: more than the tiny model's 4096-token context
        (repo / f"mod{i}.py").write_text("".join(f"def f{i}_{k}(x):\n    return x * {k} + {i}\n"
                                                 for k in range(30)), encoding="utf-8")
    home = tmp_path / "home"
    shown = codectx("context", "--repo", str(repo), "--model", str(model), "--tokenizer", str(model),
                    "--max-tokens", "1", "--json", home=home)
    assert shown.returncode == 0, shown.stderr
    layout = json.loads(shown.stdout)
    length = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    assert layout["budget"] == prefix_budget(Settings().context, length, 1) < Settings().context.budget_tokens
    assert "what `codectx ask` uses" in layout["budgetSource"]
    fit = layout["fit"]
    assert fit["whole"] >= 1 and fit["notAtAll"] >= 1 and sum(fit.values()) == 40

    question = "What does f3_2 do?"
    asked = codectx("ask", "--repo", str(repo), "--model", str(model), "--max-tokens", "1", question, home=home)
    assert asked.returncode == 0, asked.stderr
    question_tokens = len(HFTokenizer.from_dir(model).encode(question))
    said = re.search(r"\[repo .*: (\d+) files whole, (\d+) map-only .* \(budget (\d+);", asked.stderr)
    assert said, asked.stderr
    assert int(said.group(3)) == layout["budget"] - question_tokens

    table = codectx("context", "--repo", str(repo), "--tokenizer", str(model), "--budget", "unlimited", home=home)
    assert table.returncode == 0, table.stderr
    assert "(budget unlimited); 40 files whole, 0 map-only (signatures), 0 not at all (over budget)" in table.stdout


def _outcomes(state: dict, kind: str) -> dict:
    return state["counters"]["outcomes"].get(kind, {})


@SHARED
async def test_every_ask_is_counted_by_its_outcome(shared):
    """A cancelled ask counts (as `cancelled`), as does a finished one (by its finish reason)."""
    from tests.server.harness import cancel_request, start_command
    from tests.server.test_ask import ENDLESS, LONG, first_stream_token, stream_done

    before = await command(shared, "codectx.status")
    shared.streams.clear()
    task = start_command(shared, "first-use-ask", "codectx.ask", question=ENDLESS, maxTokens=LONG)
    await first_stream_token(shared)
    cancel_request(shared, "first-use-ask")
    with pytest.raises(JsonRpcException):
        await task
    await stream_done(shared)
    middle = await command(shared, "codectx.status")
    assert middle["counters"]["asks"] == before["counters"]["asks"] + 1
    assert _outcomes(middle, "ask").get("cancelled", 0) == _outcomes(before, "ask").get("cancelled", 0) + 1
    result = await command(shared, "codectx.ask", question="What does add do?", maxTokens=4)
    after = await command(shared, "codectx.status")
    reason = result["finishReason"]
    assert after["counters"]["asks"] == before["counters"]["asks"] + 2
    assert _outcomes(after, "ask").get(reason, 0) == _outcomes(middle, "ask").get(reason, 0) + 1


async def test_a_hover_model_request_is_counted_by_its_outcome(vscode_client):
    from lsprotocol import types

    from tests.server.harness import open_document

    client = vscode_client
    await command(client, "codectx.showContext")  # answers once the model is loaded
    uri = open_document(client, client.root / "util.py")
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(8, 5)))  # `greet`
    assert hover is not None
    state = await command(client, "codectx.status")
    hovers = _outcomes(state, "hover")
    assert state["counters"]["hovers"] == 1 and sum(hovers.values()) == 1
    assert set(hovers) <= {"stop", "length", "repetition"}, hovers


@SHARED
async def test_the_editor_gets_prefill_percentages(shared):
    """$/progress: the begin carries a percentage (so clients show the reports'), the prefill
    reports go up to 100 and never back."""
    shared.progress_reports.clear()
    question = "Please explain, step by step, " + " and ".join(f"what f{i} returns" for i in range(20)) + "?"
    await command(shared, "codectx.ask", question=question, maxTokens=2)
    (reports,) = [r for token, r in shared.progress_reports.items() if str(token).startswith("codectx-ask")]
    assert reports[0].kind == "begin" and reports[0].percentage == 0
    percentages = [r.percentage for r in reports if r.kind == "report" and r.percentage is not None]
    assert len(percentages) >= 2 and percentages == sorted(percentages) and percentages[-1] == 100, percentages
    assert all("tokens" in r.message for r in reports if r.kind == "report" and r.percentage is not None)


def test_cli_prefill_bar_shows_tokens_and_rate(tmp_path):
    """On a terminal, `ask` draws the prefill bar: tokens done / total and a tok/s rate."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from tests.server.harness import REPO_ROOT, build_server_test_model, write_sample_workspace

    model = build_server_test_model(tmp_path / "model")
    (tmp_path / "repo").mkdir()
    repo = write_sample_workspace(tmp_path / "repo")
    master, slave = pty.openpty()  # stderr on a terminal (120 columns), as a person running it has
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "ask", "--repo", str(repo), "--model", str(model),
                             "--max-tokens", "2", "--prefill-chunk", "64", "What does add do?"],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, CODECTX_HOME=str(tmp_path / "home")))
    os.close(slave)
    written = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        written += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0, written.decode(errors="replace")
    text = written.decode(errors="replace")
    bars = re.findall(r"prefill:\s+\d+%\|[^|]*\| (\d+)/(\d+) \[[^,]*, ([\d.]+)tok/s\]", text)
    assert bars, text[-2000:]
    done, total, rate = bars[-1]
    assert done == total and int(total) > 3 * 64 and float(rate) > 0  # several chunks
