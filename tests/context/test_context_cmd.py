"""`codectx context`: table and JSON output on the fixture repository."""
from __future__ import annotations

import json

import pytest

from server import context_cmd


@pytest.fixture
def tokenizer_dir(tmp_path, smol_tokenizer):
    folder = tmp_path / "tok"
    folder.mkdir()
    smol_tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": smol_tokenizer.chat_template}))
    return folder


def test_json_layout(repo, tokenizer_dir, capsys):
    assert context_cmd.main(["--repo", str(repo), "--tokenizer", str(tokenizer_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    keys = [s["key"] for s in out["segments"]]
    assert keys[:2] == ["system", "README.md"]
    assert out["tokens"] == sum(s["tokens"] for s in out["segments"])
    assert {"path": "package-lock.json", "reason": "lockfile"} in out["skipped"]


def test_table_with_budget_is_deterministic(repo, tokenizer_dir, capsys):
    args = ["--repo", str(repo), "--tokenizer", str(tokenizer_dir), "--budget", "1000"]
    assert context_cmd.main(args) == 0
    first = capsys.readouterr().out
    assert context_cmd.main(args) == 0
    assert capsys.readouterr().out == first
    assert "map-only" in first and "pinned" in first and "(budget 1000)" in first
    assert "skipped package-lock.json: lockfile" in first


def test_bad_repo_is_a_clean_error(tmp_path, tokenizer_dir, capsys):
    assert context_cmd.main(["--repo", str(tmp_path / "nope"), "--tokenizer", str(tokenizer_dir)]) == 2
    assert "not a folder" in capsys.readouterr().err
