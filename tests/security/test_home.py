"""The cache folder (CODECTX_HOME): created private, and a shared or foreign one is called out.

It holds token caches of the user's source, checkpoints of the model's state over it and
converted models the engine loads, so other local users must neither read nor plant them.
Each test runs the real CLI (`codectx context`) in a subprocess with its own home.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.tiny_models import train_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def run_context(home: Path, repo: Path, tokenizer_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CODECTX_HOME=str(home), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "server.cli", "context", "--repo", str(repo),
                           "--tokenizer", str(tokenizer_dir), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture()
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "app.py").write_text("def main():\n    return 1\n")
    return root


def test_a_new_home_is_created_private(tmp_path, repo, tokenizer_dir):
    home = tmp_path / "fresh" / "codectx"
    done = run_context(home, repo, tokenizer_dir)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert "cache folder" not in done.stderr
    assert '"app.py"' in done.stdout


@pytest.mark.parametrize(("mode", "says"), [(0o777, "writable by other users"), (0o755, "readable by other users")])
def test_a_home_others_can_reach_is_reported_and_the_command_still_works(tmp_path, repo, tokenizer_dir, mode, says):
    home = tmp_path / "shared"
    home.mkdir()
    home.chmod(mode)
    done = run_context(home, repo, tokenizer_dir)
    assert done.returncode == 0, done.stderr
    assert says in done.stderr and f"chmod 700 {home}" in done.stderr
    assert '"app.py"' in done.stdout
    home.chmod(0o700)
    again = run_context(home, repo, tokenizer_dir)
    assert again.returncode == 0 and "cache folder" not in again.stderr
