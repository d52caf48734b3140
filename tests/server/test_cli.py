"""The `codectx` command line: help without MLX, and `ask` end to end as a subprocess."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.tiny_models import build_tiny_model
from tests.server.harness import build_server_test_model, write_sample_workspace

ROOT = Path(__file__).resolve().parents[2]
FOOTER = re.compile(r"\[prompt (\d+) tok \(cached (\d+), recomputed (\d+)\) \| prefill [\d.]+ s, \d+ tok/s \| "
                    r"TTFT [\d.]+ s \| decode (\d+) tok, [\d.]+ tok/s \| (stop|length)\]")
FOOTER_ANY = re.compile(r"\[prompt .* \| (\w+)\]")


def codectx(*args: str, timeout: float = 120, home: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, CODECTX_HOME=str(home)) if home is not None else None
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("cli-model"))


@pytest.mark.parametrize("argv", [["--help"], ["ask", "--help"], ["doctor", "--help"]])
def test_help_does_not_import_mlx(argv):
    script = ("import sys\nimport server.cli\n"
              f"try:\n    server.cli.main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
              "assert 'mlx' not in sys.modules and 'mlx.core' not in sys.modules, 'mlx imported'\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage: codectx" in result.stdout


def test_top_level_help_lists_subcommands():
    result = codectx("--help")
    assert result.returncode == 0
    for name in ("ask", "doctor", "serve"):
        assert re.search(rf"^\s+{name}\s", result.stdout, re.M), name


def test_unknown_subcommand_fails_with_usage():
    result = codectx("frobnicate")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def _expected_answer(model_dir: Path, question: str, max_tokens: int) -> tuple[str, int]:
    from engine.engine import Engine
    from engine.loading import load_model
    from server.ask_cmd import build_messages

    with Engine(load_model(str(model_dir), progress=False)) as engine:
        ids = engine.chat_ids(build_messages(question))
        return engine.generate_text(ids, max_tokens=max_tokens), len(ids)


def test_ask_streams_the_engine_answer_and_prints_footer(cli_model):
    result = codectx("ask", "--model", str(cli_model), "--max-tokens", "12", "What does add do?")
    assert result.returncode == 0, result.stderr
    expected, prompt_tokens = _expected_answer(cli_model, "What does add do?", 12)
    assert result.stdout == expected + "\n" and expected.strip()
    footer = FOOTER.search(result.stderr)
    assert footer, result.stderr
    prompt, cached, recomputed, decoded = map(int, footer.groups()[:4])
    assert (prompt, cached, recomputed) == (prompt_tokens, 0, prompt_tokens)
    assert 0 < decoded <= 12


def test_ask_with_repo_puts_files_in_the_prompt(cli_model, tmp_path):
    (tmp_path / "util.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "notes.md").write_text("Grüße 🙂\n")
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0binary")
    result = codectx("ask", "--repo", str(tmp_path), "--model", str(cli_model), "--max-tokens", "4", "q?",
                     "--kv-bits", "8")
    assert result.returncode == 0, result.stderr
    assert re.search(r"2 files whole, 0 map-only \(signatures\), 0 not at all \(over budget\); 1 skipped",
                     result.stderr), result.stderr
    bare = codectx("ask", "--model", str(cli_model), "--max-tokens", "4", "q?")
    with_repo, without = (int(FOOTER.search(r.stderr).group(1)) for r in (result, bare))
    assert with_repo > without + 10


def test_ask_with_repo_says_once_what_it_focused_on_before_the_answer(cli_model, tmp_path):
    (tmp_path / "util.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "main.py").write_text("from util import add\nprint(add(1, 2))\n")
    result = codectx("ask", "--repo", str(tmp_path), "--model", str(cli_model), "--max-tokens", "4",
                     "What does add do?")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    focus = [i for i, line in enumerate(lines) if line.startswith("[focus: ")]
    footer = next(i for i, line in enumerate(lines) if FOOTER.search(line))
    assert len(focus) == 1 and focus[0] < footer, result.stderr
    assert re.match(r"\[focus: util\.py:1-2 add \(\d+ tok\); .*`codectx context --question` shows why\]$",
                    lines[focus[0]]), lines[focus[0]]


def test_a_question_longer_than_the_context_is_named_before_the_repository_is_scanned(cli_model, tmp_path):
    (tmp_path / "util.py").write_text("def add(a, b):\n    return a + b\n")
    from engine.loading import load_model

    context = load_model(str(cli_model), progress=False).context_length
    result = codectx("ask", "--repo", str(tmp_path), "--model", str(cli_model), "--max-tokens", "4",
                     "why " * context)
    assert result.returncode == 1, result.stderr
    assert re.search(rf"codectx ask: the question and its selection are \d+ tokens; with an answer of 4 the "
                     rf"model's context of {context} tokens has room for {context - 4}", result.stderr), result.stderr
    assert "budget" not in result.stderr and "files whole" not in result.stderr  # refused before the scan


def test_ask_interrupted_cancels_and_exits_130(tmp_path):
    endless = build_tiny_model(tmp_path / "endless", eos_token=None)  # the stream cannot end before SIGINT
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "ask", "--model", str(endless),
                             "--max-tokens", "3000", "Tell me everything."],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a background job inherits SIGINT ignored, and Python keeps it so
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.read(1)  # the answer is streaming
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    footer = FOOTER_ANY.search(err)
    assert footer and footer.group(1) == "cancelled" and "Traceback" not in err


def test_ctrl_c_during_the_repository_scan_exits_130_at_once(cli_model, tmp_path):
    """The scan ran on a worker thread that Ctrl-C did not reach: the ask exited only once
    the whole repository was scanned (6.6 s on 1,500 files). Now the next parsed file stops it."""
    repo = tmp_path / "repo"
    body = "".join(f"def f{n}(x):\n    return g(x, {n}) + h(x)\n\n\n" for n in range(100))
    for i in range(2000):  # seconds of parsing: the bar shows after 0.5 s, long before the end
        (repo / f"pkg{i % 40}").mkdir(parents=True, exist_ok=True)
        (repo / f"pkg{i % 40}" / f"mod{i}.py").write_text(f"import os\n\n\n{body}# {i}\n")
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "ask", "--repo", str(repo), "--model",
                             str(cli_model), "--max-tokens", "4", "q?"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err = b""
    try:
        while b"parsing" not in err:
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, err.decode()
            err += chunk
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = (err + rest).decode()
    assert proc.returncode == 130, err
    assert "[repo" not in err and out == b"" and "Traceback" not in err  # the scan never finished


def test_ask_with_missing_model_fails_cleanly(tmp_path):
    result = codectx("ask", "--model", str(tmp_path / "nope"), "hi")
    assert result.returncode == 2 and "codectx ask:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_temperature_that_cannot_sample_is_a_usage_error(cli_model, value):
    result = codectx("ask", "--model", str(cli_model), "--temperature", value, "hi")
    assert result.returncode == 2 and "--temperature must be a number >= 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_any_integer_seed_samples(cli_model):
    """A negative or 80-bit seed was a TypeError traceback (the generators take unsigned 64-bit seeds)."""
    for seed in ("-1", "99999999999999999999999"):
        result = codectx("ask", "--model", str(cli_model), "--temperature", "1", "--seed", seed, "--max-tokens",
                         "3", "hi")
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_a_repository_whose_folder_name_is_not_utf8_works(cli_model, tmp_path):
    """Linux names are bytes: hashing the root for its state file raised UnicodeEncodeError for `ask` and
    `context` alike."""
    repo = tmp_path / os.fsdecode(b"repo\xff")
    repo.mkdir()
    (repo / "util.py").write_text("def add(a, b):\n    return a + b\n", encoding="utf-8")
    shown = codectx("context", "--repo", str(repo), "--tokenizer", str(cli_model))
    asked = codectx("ask", "--repo", str(repo), "--model", str(cli_model), "--max-tokens", "2", "What is add?")
    for result in (shown, asked):
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "util.py" in shown.stdout


@pytest.mark.parametrize("case", ["config", "log-folder", "log-missing", "connections", "eval-lengths"])
def test_bad_option_values_are_one_line_usage_errors(cli_model, tmp_path, case):
    """Each was a traceback (exit 1), some only after the model had loaded."""
    bad_model = tmp_path / "bad-model"
    bad_model.mkdir()
    (bad_model / "config.json").write_text("not json", encoding="utf-8")
    (tmp_path / "repo").mkdir()
    args, expected = {
        "config": (["context", "--repo", str(tmp_path / "repo"), "--tokenizer", str(cli_model), "--model",
                    str(bad_model)], "is not a model config"),
        "log-folder": (["serve", "--http", "0", "--log-file", str(tmp_path)], "cannot write the log file"),
        "log-missing": (["serve", "--http", "0", "--log-file", str(tmp_path / "no" / "log")],
                        "cannot write the log file"),
        "connections": (["serve", "--http", "0", "--model", str(cli_model), "--max-connections", "99999999999"],
                        "max_connections and prompt_workers must be 1 to"),
        "eval-lengths": (["eval", "--model", str(cli_model), "--lengths", "abc"], "--lengths and --seeds take integers"),
    }[case]
    result = codectx(*args, home=tmp_path / "home")
    assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("closed", [0, 1])
def test_ask_runs_with_a_closed_standard_stream(cli_model, tmp_path, closed):
    """With stdin closed the model file took descriptor 0, which MLX refused ("cannot load model"); with
    stdout closed, printing the answer found no stream."""
    result = subprocess.run([sys.executable, "-m", "server.cli", "ask", "--model", str(cli_model), "--max-tokens",
                             "3", "hi"], cwd=ROOT, capture_output=closed != 1, text=True, timeout=120,
                            preexec_fn=lambda: os.close(closed), stderr=subprocess.PIPE if closed == 1 else None,
                            env=dict(os.environ, CODECTX_HOME=str(tmp_path)))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_ask_piped_into_a_reader_that_stops_ends_quietly(cli_model, tmp_path):
    """`codectx ask ... | head -c5`: exit 141 as a shell reports SIGPIPE, no BrokenPipeError traceback."""
    process = subprocess.Popen([sys.executable, "-m", "server.cli", "ask", "--model", str(cli_model),
                                "--max-tokens", "400", "hi"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=dict(os.environ, CODECTX_HOME=str(tmp_path)))
    assert process.stdout.read(5)
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 141 and b"Traceback" not in err, err


def test_a_missing_repository_is_a_usage_error_for_ask_and_context(cli_model, tmp_path):
    """The same bad input gets the same status from both commands (README, CLI: 2 = usage)."""
    missing = str(tmp_path / "nope")
    asked = codectx("ask", "--repo", missing, "--model", str(cli_model), "hi")
    shown = codectx("context", "--repo", missing, "--tokenizer", str(cli_model))
    for result, name in ((asked, "ask"), (shown, "context")):
        assert result.returncode == 2, result.stderr
        assert f"codectx {name}:" in result.stderr and "nope" in result.stderr and "Traceback" not in result.stderr


def test_a_second_ask_restores_the_repository_prefix(tmp_path):
    """`codectx ask --repo` goes through the core's backend with the disk archive on: a second
    process on the unchanged repository restores the prefix instead of recomputing it."""
    model = build_server_test_model(tmp_path / "model")
    (tmp_path / "repo").mkdir()
    repo = write_sample_workspace(tmp_path / "repo")
    for i in range(8):  # a prefix long enough that the question is a small part of the prompt
        (repo / f"mod{i}.py").write_text("".join(f"def f{i}_{k}(x):\n    return x * {k} + {i}\n"
                                                 for k in range(12)), encoding="utf-8")
    args = ("ask", "--repo", str(repo), "--model", str(model), "--max-tokens", "4", "What does add do?")
    first, second = (codectx(*args, home=tmp_path / "home") for _ in range(2))
    footers = []
    for result in (first, second):
        assert result.returncode == 0, result.stderr
        footer = FOOTER.search(result.stderr)
        assert footer, result.stderr
        footers.append(tuple(map(int, footer.groups()[:3])))
    (prompt, cached, recomputed), (prompt_again, restored, recomputed_again) = footers
    assert prompt == prompt_again and prompt > 1000
    assert cached == 0 and recomputed == prompt  # cold: nothing archived yet
    assert restored >= 0.95 * prompt and restored + recomputed_again == prompt
    assert second.stdout == first.stdout  # a restored prefix answers as a computed one


@pytest.mark.default_model
def test_doctor_on_default_model():
    result = codectx("doctor", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ready: true" in result.stdout


@pytest.mark.default_model
def test_ask_default_model_answers():
    result = codectx("ask", "--max-tokens", "12", "What is the capital of France?", timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout and FOOTER.search(result.stderr)
