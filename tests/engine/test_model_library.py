"""Model discovery: a fake Ollama library and LM Studio folder laid out as those tools lay them out
(manifest JSON, `sha256-<hex>` blob names, publisher/repository folders), with GGUF files written
by the `gguf` package's writer; `codectx models` lists them, `ollama:` / `lmstudio:` specs resolve,
and bad inputs give clear errors."""
from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
from gguf import GGUFWriter, LlamaFileType

from engine.errors import ModelNotFoundError
from engine.gguf_read import open_gguf
from engine.model_library import find_models, gguf_quantisation, resolve_spec
from server import models_cmd


def write_gguf(path, architecture: str, file_type: LlamaFileType) -> bytes:
    """A header-complete GGUF with one small float32 tensor; returns its bytes."""
    writer = GGUFWriter(str(path), architecture)
    writer.add_file_type(int(file_type))
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def ollama_model(root, name: str, tag: str, data: bytes | None, namespace: str = "library") -> str:
    """Lays out one Ollama model: the manifest, and the blob unless `data` is None; returns the digest."""
    digest = hashlib.sha256(data or name.encode()).hexdigest()
    manifest = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data or b"")},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10}]}))
    if data is not None:
        (root / "blobs").mkdir(exist_ok=True)
        (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return digest


@pytest.fixture
def library(tmp_path, monkeypatch):
    ollama, lmstudio = tmp_path / "ollama", tmp_path / "lmstudio"
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("CODECTX_LMSTUDIO_MODELS", str(lmstudio))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    qwen = write_gguf(tmp_path / "qwen.gguf", "qwen2", LlamaFileType.MOSTLY_Q4_K_M)
    llama = write_gguf(tmp_path / "llama.gguf", "llama", LlamaFileType.MOSTLY_F16)
    ollama_model(ollama, "qwen2.5-coder", "7b", qwen)
    ollama_model(ollama, "tiny-llama", "latest", llama)
    ollama_model(ollama, "phi", "mini", write_gguf(tmp_path / "phi.gguf", "phi3", LlamaFileType.MOSTLY_Q4_K_M))
    ollama_model(ollama, "gone", "latest", None)  # a manifest whose blob was deleted
    folder = lmstudio / "lmstudio-community" / "Qwen2.5-Coder-7B-GGUF"
    folder.mkdir(parents=True)
    (folder / "Qwen2.5-Coder-7B-Q4_K_M.gguf").write_bytes(qwen)
    (lmstudio / "broken" / "truncated").mkdir(parents=True)
    (lmstudio / "broken" / "truncated" / "half.gguf").write_bytes(llama[: len(llama) // 3])
    return tmp_path


def test_every_library_model_is_listed_with_its_header_and_whether_it_loads(library):
    found = {m.spec: m for m in find_models()}
    qwen = found["ollama:qwen2.5-coder:7b"]
    assert (qwen.source, qwen.format, qwen.architecture, qwen.quantisation) == ("ollama", "gguf", "qwen2", "Q4_K_M")
    assert qwen.loadable
    assert found["ollama:phi:mini"].why_not.startswith("architecture phi3: not supported (supported: llama, qwen2")
    assert found["ollama:tiny-llama:latest"].loadable and found["ollama:tiny-llama:latest"].quantisation == "F16"
    assert found["ollama:gone:latest"].why_not.startswith("blob sha256-") and "missing" in found["ollama:gone:latest"].why_not
    studio = found["lmstudio:lmstudio-community/Qwen2.5-Coder-7B-GGUF/Qwen2.5-Coder-7B-Q4_K_M.gguf"]
    assert (studio.source, studio.architecture, studio.quantisation) == ("lmstudio", "qwen2", "Q4_K_M")
    assert found["lmstudio:broken/truncated/half.gguf"].why_not.startswith("unreadable GGUF")

    out = io.StringIO()
    assert models_cmd.main([], out=out) == 0
    table = out.getvalue()
    assert "ollama:qwen2.5-coder:7b" in table and "no: architecture phi3: not supported" in table
    out = io.StringIO()
    models_cmd.main(["--json"], out=out)
    *rows, last = [json.loads(line) for line in out.getvalue().splitlines()]  # models, then the recommendation
    assert {r["spec"] for r in rows} == set(found) and all("loadable" in r for r in rows) and "recommendation" in last


def test_specs_resolve_to_the_gguf_and_bad_ones_say_why(library):
    blob = resolve_spec("ollama:tiny-llama")  # the tag defaults to latest
    opened = open_gguf(blob)
    assert blob.name.startswith("sha256-") and (opened.architecture, gguf_quantisation(opened)) == ("llama", "F16")
    assert resolve_spec("lmstudio:lmstudio-community/Qwen2.5-Coder-7B-GGUF").name == "Qwen2.5-Coder-7B-Q4_K_M.gguf"
    assert resolve_spec("/some/model/dir") is None
    with pytest.raises(ModelNotFoundError, match="which is missing"):
        resolve_spec("ollama:gone")
    with pytest.raises(ModelNotFoundError, match=r"no Ollama model 'nothing:latest'.*found: ollama:gone:latest"):
        resolve_spec("ollama:nothing")
    with pytest.raises(ModelNotFoundError, match="no LM Studio model"):
        resolve_spec("lmstudio:nobody/nothing")


def test_an_ollama_spec_loads_the_gguf_it_names(tmp_path, monkeypatch, default_model_path):
    from engine.default_model import GGUF_NAME
    from engine.loading import load_model

    gguf = default_model_path / GGUF_NAME
    ollama = tmp_path / "ollama"
    digest = ollama_model(ollama, "smollm2", "135m", b"placeholder")
    blob = ollama / "blobs" / f"sha256-{digest}"
    blob.unlink()
    blob.symlink_to(gguf)  # the real default GGUF as the blob
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    loaded = load_model("ollama:smollm2:135m", progress=False)
    assert loaded.model_id == "ollama:smollm2:135m"
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("def add(a, b):")) == "def add(a, b):"
