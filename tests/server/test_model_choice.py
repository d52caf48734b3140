"""The model recommendation (`server.core.model_choice`): the memory rule, the family ranking and
what to get, over a fake Ollama library, LM Studio folder and hub cache (tests/fake_library.py)
with machines of different memory injected; the README's table against the rules; and
`codectx models` / `codectx doctor` end to end as subprocesses on the fake libraries."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import LlamaFileType

from engine.gguf_convert import GROUP_SIZE
from engine.machine import Machine, this_machine
from engine.model_library import find_models
from server.core.model_choice import CATALOGUE, Budget, catalogue_choice, choose, profile_of
from server.core.settings import Settings
from tests.fake_library import FakeModel, add_mlx_snapshot, add_ollama, write_gguf

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
SMALL = Budget(checkpoint_bytes=0, context_tokens=64)  # the rules at the fakes' scale

BIG = FakeModel("llama", "Mystery Base", 2**22)
CODER_LARGE = FakeModel("qwen2", "Qwen2.5 Coder Large", 2**20)
CODER_SMALL = FakeModel("qwen2", "Qwen2.5 Coder Small", 2**18)
LLAMA3 = FakeModel("llama", "Llama 3.2 Instruct", 2**19)
LLAMA3_Q8 = FakeModel("llama", "Meta Llama 3.1 Instruct", 2**19, LlamaFileType.MOSTLY_Q8_0)
LLAMA3_Q3 = FakeModel("llama", "Llama 3.1 Instruct", 2**21, LlamaFileType.MOSTLY_Q3_K_M)
EMBEDDER = FakeModel("nomic-bert", "nomic embed text", 2**16)

SPECS = {
    "big": "ollama:big-llama:latest",
    "coder-large": "mlx-community/Qwen2.5-Coder-Large-4bit",
    "llama3": "ollama:llama3.2:small",
    "llama3-q8": "lmstudio:lmstudio-community/Meta-Llama-3.1-GGUF/Meta-Llama-3.1-Q8_0.gguf",
    "coder-small": "mlx-community/Qwen2.5-Coder-Small",
    "llama3-q3": "ollama:llama3.1:q3",
}


def metal(memory: int) -> Machine:
    return Machine(memory, True, True, "Darwin")


def cpu(memory: int) -> Machine:
    return Machine(memory, False, False, "Linux")


@pytest.fixture
def library(tmp_path, monkeypatch):
    """The fake libraries; returns the environment that points discovery at them."""
    env = {"OLLAMA_MODELS": str(tmp_path / "ollama"), "CODECTX_LMSTUDIO_MODELS": str(tmp_path / "lmstudio"),
           "HF_HUB_CACHE": str(tmp_path / "hub"), "CODECTX_HOME": str(tmp_path / "home")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    files = tmp_path / "files"
    files.mkdir()
    ollama = tmp_path / "ollama"
    add_ollama(ollama, "big-llama", "latest", write_gguf(files / "big.gguf", BIG))
    add_ollama(ollama, "llama3.2", "small", write_gguf(files / "l3.gguf", LLAMA3))
    add_ollama(ollama, "llama3.1", "q3", write_gguf(files / "q3.gguf", LLAMA3_Q3))
    add_ollama(ollama, "nomic-embed-text", "latest", write_gguf(files / "embed.gguf", EMBEDDER))
    studio = tmp_path / "lmstudio" / "lmstudio-community" / "Meta-Llama-3.1-GGUF"
    studio.mkdir(parents=True)
    write_gguf(studio / "Meta-Llama-3.1-Q8_0.gguf", LLAMA3_Q8)
    broken = tmp_path / "lmstudio" / "someone" / "Broken-GGUF"
    broken.mkdir(parents=True)
    whole = write_gguf(files / "cut.gguf", BIG)
    (broken / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    write_gguf(broken / "no-blocks.gguf", FakeModel("llama", "no block counts", 2**20), with_blocks=False)
    add_mlx_snapshot(tmp_path / "hub", SPECS["coder-large"], CODER_LARGE, bits=4)
    add_mlx_snapshot(tmp_path / "hub", SPECS["coder-small"], CODER_SMALL)
    return env


def _profiles():
    return [profile_of(m) for m in find_models()]


def test_memory_each_model_needs_on_metal_and_on_the_cpu(library):
    profiles = _profiles()
    on_metal = {a.spec: a for a in choose(profiles, metal(2**40), SMALL).assessed}
    on_cpu = {a.spec: a for a in choose(profiles, cpu(2**40), SMALL).assessed}
    big_metal, big_cpu = on_metal[SPECS["big"]], on_cpu[SPECS["big"]]
    from engine.gguf import DEFAULT_GGUF_BITS

    # Metal: converted to DEFAULT_GGUF_BITS, or the file's own bits up to 8 where more (this one
    # is F16: 8), plus a float16 scale and bias per group; KV in 2 bytes
    assert big_metal.weights_bytes == int(2**22 * (max(DEFAULT_GGUF_BITS, 8) + 32 / GROUP_SIZE) / 8)
    assert big_metal.kv_bytes == BIG.kv_values_per_token * 64 * 2
    # CPU: float32 weights and KV
    assert (big_cpu.weights_bytes, big_cpu.kv_bytes) == (2**22 * 4, BIG.kv_values_per_token * 64 * 4)
    coder = on_metal[SPECS["coder-large"]]  # an mlx-lm directory stays as it is on disk
    folder = Path(os.environ["HF_HUB_CACHE"]) / "models--mlx-community--Qwen2.5-Coder-Large-4bit"
    assert coder.weights_bytes == sum(p.stat().st_size for p in folder.glob("snapshots/*/*"))
    assert coder.parameters == 2**20 and on_cpu[SPECS["coder-large"]].weights_bytes == 2**20 * 4
    assert on_metal["ollama:nomic-embed-text:latest"].why_not.startswith("architecture nomic-bert")
    assert on_metal["lmstudio:someone/Broken-GGUF/cut.gguf"].why_not.startswith("unreadable GGUF")
    assert on_metal["lmstudio:someone/Broken-GGUF/no-blocks.gguf"].why_not.startswith("size unknown")

    exact = Budget(share=1.0, checkpoint_bytes=0, context_tokens=64)
    assert choose(profiles, metal(big_metal.needs_bytes), exact).best.spec == SPECS["big"]
    assert choose(profiles, metal(big_metal.needs_bytes - 1), exact).best.spec != SPECS["big"]


def test_ranking_prefers_size_then_family_and_puts_low_bits_last(library):
    profiles, order = _profiles(), []
    while (best := choose(profiles, metal(2**40), SMALL).best) is not None:
        order.append(best.spec)
        profiles = [p for p in profiles if p.spec != best.spec]
    # 4x the parameters beat code-tuning; code-tuning (worth 2x) beats Llama 3 at half the size;
    # equal size and family: the finer quantisation (F16 over Q8_0); 3-bit only when nothing else is left
    assert order == [SPECS[k] for k in ("big", "coder-large", "llama3", "llama3-q8", "coder-small", "llama3-q3")]
    assert {p.spec for p in profiles} == {"ollama:nomic-embed-text:latest", "lmstudio:someone/Broken-GGUF/cut.gguf",
                                          "lmstudio:someone/Broken-GGUF/no-blocks.gguf"}


def test_memory_decides_and_the_cpu_needs_more(library):
    profiles = _profiles()
    exact = Budget(share=1.0, checkpoint_bytes=0, context_tokens=64)
    big_need = next(a for a in choose(profiles, metal(2**40), exact).assessed if a.spec == SPECS["big"]).needs_bytes
    on_metal, on_cpu = choose(profiles, metal(big_need), exact), choose(profiles, cpu(big_need), exact)
    assert on_metal.best.spec == SPECS["big"]
    assert on_cpu.best.spec == SPECS["coder-large"]  # float32 on the CPU: the big one no longer fits
    assert on_cpu.why.startswith("Qwen2.5-Coder (code-tuned), 1M parameters, 4-bit; needs ")
    assert "GiB to spare" in on_cpu.why
    nothing = choose(profiles, cpu(1024), exact)
    assert nothing.best is None and nothing.get is None
    assert nothing.why.startswith("none of the 9 models found loads and fits: 3 cannot be loaded; 6 need more than")


def test_what_to_get_follows_the_machine(library, monkeypatch, tmp_path):
    found = choose(_profiles(), metal(16 * GIB))
    assert found.best.spec == SPECS["big"]  # every fake fits; the largest wins
    assert found.get.command == "ollama pull qwen2.5-coder:7b"  # and a real model would rank far above it
    assert found.get.spec == "ollama:qwen2.5-coder:7b" and found.get.download == "4.7 GB"
    data = found.to_json()
    assert data["model"] == SPECS["big"] and data["get"]["why"].startswith("Qwen2.5-Coder (code-tuned), 7.6B")

    for empty in ("OLLAMA_MODELS", "CODECTX_LMSTUDIO_MODELS", "HF_HUB_CACHE"):
        monkeypatch.setenv(empty, os.environ[empty] + "-none")
    assert _profiles() == []
    bare = choose([], cpu(16 * GIB))
    assert bare.best is None and bare.why == "no models found"
    assert bare.get.command == "ollama pull qwen2.5-coder:1.5b"
    assert choose([], cpu(2 * GIB)).get is None  # 70% of 2 GiB less the 2 GiB of checkpoints: nothing fits
    unknown = choose([], cpu(None))
    assert unknown.get is None and "could not be read" in unknown.why
    # a catalogue model already on the machine is not suggested again
    add_ollama(Path(os.environ["OLLAMA_MODELS"]), "qwen2.5-coder", "7b",
               write_gguf(tmp_path / "files" / "q.gguf", CODER_SMALL))
    assert choose(_profiles(), metal(16 * GIB)).get is None


def test_the_budget_follows_the_settings():
    settings = Settings()
    assert Budget().checkpoint_bytes == settings.memory.checkpoint_bytes
    prompt = settings.context.budget_tokens + settings.focus.budget_tokens + settings.ask.max_tokens
    assert prompt < Budget().context_tokens == 8192


def test_the_readmes_table_is_what_the_rules_recommend():
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (Apple Silicon|Linux CPU), (\d+) GB \| `([^`]+)` \| (.+) \|$", readme, re.M)
    assert len(rows) == 8
    for kind, gb, tag, why in rows:
        machine = metal(int(gb) * GIB) if kind == "Apple Silicon" else cpu(int(gb) * GIB)
        pick = catalogue_choice(machine)
        assert pick.spec == f"ollama:{tag}", (kind, gb)
        usable = Budget().usable(machine) / GIB
        assert f"needs {pick.needs_bytes / GIB:.1f} of " in why and f"{usable:.1f} GiB" in why, (kind, gb)
        bigger = [e for e in CATALOGUE if e.parameters > pick.parameters]
        if bigger:  # the next size up is named with its need, and does not fit
            nxt = choose([bigger[0].profile()], machine).assessed[0]
            assert f"{bigger[0].tag.split(':')[1]} would need {nxt.needs_bytes / GIB:.1f})" in why
            assert not nxt.fits


def _codectx(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_models_recommends_through_the_cli(library):
    expected_get = catalogue_choice(this_machine())  # what this machine's memory calls for
    text = _codectx(library, "models")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert any(line.startswith(SPECS["big"]) and " yes" in line for line in lines)
    assert any(line.startswith("ollama:nomic-embed-text:latest") and "no: architecture nomic-bert" in line
               for line in lines)
    head = next(line for line in lines if line.startswith("recommended for code questions on this machine ("))
    assert head.endswith(f"): {SPECS['big']}")
    if expected_get is not None:
        assert f"better for this machine: ollama pull {expected_get.spec.split(':', 1)[1]} " in text.stdout

    rows = [json.loads(line) for line in _codectx(library, "models", "--json").stdout.splitlines()]
    recommendation = rows[-1]["recommendation"]
    assert recommendation["model"] == SPECS["big"]
    assert recommendation["machine"]["memory_bytes"] == this_machine().memory_bytes
    by_spec = {row["spec"]: row for row in rows[:-1]}
    assert by_spec[SPECS["big"]]["fits"] and by_spec[SPECS["big"]]["parameters"] == 2**22
    assert not by_spec["ollama:nomic-embed-text:latest"]["fits"]
    assert by_spec[SPECS["coder-large"]]["family"] == "Qwen2.5-Coder (code-tuned)"



def test_doctor_names_the_best_model_found(library):
    doctor = _codectx(library, "doctor")
    assert doctor.returncode == 0, doctor.stderr
    line = next(line for line in doctor.stdout.splitlines() if "model choice" in line)
    assert line.startswith(f"ok    model choice: {SPECS['big']} (llama, 4M parameters, F16; needs ")
    assert doctor.stdout.splitlines()[-1] == "ready: true"
