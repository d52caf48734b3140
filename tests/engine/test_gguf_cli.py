"""`codectx models` and `codectx ask --model ollama:NAME:TAG` end to end, as subprocesses, on a
fake Ollama library (laid out as Ollama lays it out) holding a tiny qwen2 GGUF in a Q4_K_M mix
(Q4_K matrices, attn_v and ffn_down in Q6_K, norms and biases F32), written by the `gguf`
package. Every process gets its own CODECTX_HOME, Ollama, LM Studio and Hugging Face folders."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType
from gguf_models import q4_k_m_types, write_gguf
from test_model_library import ollama_model

from engine.gguf import DEFAULT_GGUF_BITS
from engine.model_manifest import manifest_problem

ROOT = Path(__file__).resolve().parents[2]
SPEC = "ollama:tiny-qwen2.5-coder:q4_k_m"
QUESTION = "What does add do?"
FOOTER = re.compile(r"\[prompt (\d+) tok \(cached \d+, recomputed \d+\) \| .* \| "
                    r"decode (\d+) tok, .* \| (stop|length)\]")


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> dict[str, str]:
    """The environment of a machine whose only model is the tiny one in Ollama's library."""
    root = tmp_path_factory.mktemp("gguf-cli")
    tiny = write_gguf(root / "tiny.gguf", "qwen2", Q.Q4_K, types=q4_k_m_types(2),
                      file_type=LlamaFileType.MOSTLY_Q4_K_M)
    ollama_model(root / "ollama", "tiny-qwen2.5-coder", "q4_k_m", tiny.path.read_bytes())
    return dict(os.environ, OLLAMA_MODELS=str(root / "ollama"), CODECTX_HOME=str(root / "home"),
                CODECTX_LMSTUDIO_MODELS=str(root / "lmstudio"), HF_HUB_CACHE=str(root / "hf"))


def codectx(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_models_lists_the_ollama_gguf_as_loadable(library):
    result = codectx(library, "models", "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    row = next(r for r in rows if r.get("spec") == SPEC)
    described = (row["source"], row["format"], row["architecture"], row["quantisation"])
    assert described == ("ollama", "gguf", "qwen2", "Q4_K_M")
    assert row["loadable"] is True and row["why_not"] is None
    table = codectx(library, "models")
    assert table.returncode == 0, table.stderr
    line = next(line for line in table.stdout.splitlines() if line.startswith(SPEC))
    assert line.split()[1:5] == ["ollama", "gguf", "qwen2", "Q4_K_M"] and line.rstrip().endswith("yes")


def _expected_answer(env: dict[str, str], monkeypatch) -> str:
    """The same question through an in-process Engine on the same Ollama spec (greedy)."""
    from engine.engine import Engine
    from engine.loading import load_model
    from server.ask_cmd import build_messages

    monkeypatch.setenv("OLLAMA_MODELS", env["OLLAMA_MODELS"])
    with Engine(load_model(SPEC, progress=False)) as engine:
        return engine.generate_text(engine.chat_ids(build_messages(QUESTION)), max_tokens=8)


def test_ask_on_the_ollama_spec_converts_once_and_answers(library, monkeypatch):
    first = codectx(library, "ask", "--model", SPEC, "--max-tokens", "8", QUESTION)
    assert first.returncode == 0, first.stderr
    footer = FOOTER.search(first.stderr)
    assert footer and int(footer.group(2)) > 0, first.stderr
    # a tiny random model's answer is gibberish, but it is this model's greedy answer
    assert first.stdout.strip() and first.stdout == _expected_answer(library, monkeypatch) + "\n"

    cache = Path(library["CODECTX_HOME"]) / "models" / "gguf"
    converted = [p for p in cache.iterdir() if p.is_dir()]
    assert [p.name.endswith(f"-b{DEFAULT_GGUF_BITS}") for p in converted] == [True]
    assert manifest_problem(converted[0]) is None
    stamps = {p.name: p.stat().st_mtime_ns for p in converted[0].iterdir()}

    second = codectx(library, "ask", "--model", SPEC, "--max-tokens", "8", QUESTION)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert {p.name: p.stat().st_mtime_ns for p in converted[0].iterdir()} == stamps  # not converted again


def test_ask_converts_at_the_bits_asked_for(library):
    asked = codectx(library, "ask", "--model", SPEC, "--gguf-bits", "8", "--max-tokens", "2", QUESTION)
    assert asked.returncode == 0, asked.stderr
    cache = Path(library["CODECTX_HOME"]) / "models" / "gguf"
    assert any(p.name.endswith("-b8") and manifest_problem(p) is None for p in cache.iterdir() if p.is_dir())
    refused = codectx(library, "models", "--gguf-bits", "5")
    assert refused.returncode == 2 and "--gguf-bits" in refused.stderr
