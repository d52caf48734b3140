"""Bad GGUF inputs: each gives a clear ModelLoadError / ModelNotFoundError, leaves nothing
half-written under `<CODECTX_HOME>/models/gguf`, leaves an earlier good conversion as it was,
and a good file still loads afterwards.

The files are tiny models written by the `gguf` package (tests/engine/gguf_models.py), then
damaged; the Ollama library is laid out as Ollama lays it out (tests/engine/test_model_library.py).
"""
from __future__ import annotations

import struct

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from gguf_models import TinyGGUF, write_gguf
from test_model_library import ollama_model

from engine.errors import ModelLoadError, ModelNotFoundError
from engine.gguf_convert import converted_dir
from engine.loading import load_model
from engine.model_manifest import manifest_problem


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> TinyGGUF:
    return write_gguf(tmp_path_factory.mktemp("good") / "good-qwen2.gguf", "qwen2", Q.Q4_K)


@pytest.fixture
def home(tmp_path, monkeypatch, good):
    """A fresh CODECTX_HOME holding one good conversion, made before the bad input arrives."""
    home = tmp_path / "home"
    monkeypatch.setenv("CODECTX_HOME", str(home))
    load_model(str(good.path), progress=False, gguf_bits=32)
    return home


def snapshot(home) -> dict[str, int]:
    """Every entry under models/gguf with its modification time."""
    folder = home / "models" / "gguf"
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def assert_nothing_half_written(home, before: dict[str, int], good: TinyGGUF) -> None:
    """The cache is as it was, but for empty lock files (a conversion's advisory lock), and the
    good conversion is intact and loads without converting again."""
    after = snapshot(home)
    folder = home / "models" / "gguf"
    new = [name for name in set(after) - set(before)
           if not (name.endswith(".lock") and (folder / name).stat().st_size == 0)]
    assert new == [], f"left behind: {new}"
    assert {k: v for k, v in after.items() if k in before} == before
    assert manifest_problem(converted_dir(good.path, 32)) is None
    loaded = load_model(str(good.path), progress=False, gguf_bits=32)
    assert snapshot(home) == after  # loaded from the cache, not converted again
    ids = mx.array([good.vocab.encode("def add(a, b):\n    return a + b\n")])
    expected = good.reference(32)(ids)
    assert (mx.abs(loaded.model(ids) - expected).max() / mx.abs(expected).max()).item() <= 1e-4


@pytest.mark.parametrize("cut", ["in the metadata", "in the tensor data"])
def test_truncated_gguf_is_a_clear_load_error(home, good, tmp_path, cut):
    data = good.path.read_bytes()
    at = 2000 if cut == "in the metadata" else len(data) * 2 // 3
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[:at])
    before = snapshot(home)
    with pytest.raises(ModelLoadError, match=r"truncated\.gguf.*truncated"):
        load_model(str(truncated), progress=False, gguf_bits=8)
    assert_nothing_half_written(home, before, good)


def test_unknown_architecture_is_named_with_what_is_supported(home, good, tmp_path):
    path = write_gguf(tmp_path / "mamba.gguf", "qwen2", Q.F16, architecture="mamba").path
    before = snapshot(home)
    with pytest.raises(ModelLoadError, match=r"'mamba'.*supported: .*qwen2"):
        load_model(str(path), progress=False, gguf_bits=8)
    assert_nothing_half_written(home, before, good)


def test_a_tensor_type_that_cannot_be_converted_is_named(home, good, tmp_path):
    """Q8_1 is a real GGML type the `gguf` package reads but cannot dequantize; the failure comes
    mid-conversion (earlier tensors are converted already), so the staging directory existed."""
    with pytest.raises(NotImplementedError):  # the premise: if gguf learns Q8_1, pick another
        quants.dequantize(np.zeros((1, 40), dtype=np.uint8), Q.Q8_1)
    path = write_gguf(tmp_path / "odd.gguf", "qwen2", Q.Q4_K, types={"blk.1.ffn_down.weight": Q.Q8_1}).path
    before = snapshot(home)
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_down\.weight.*Q8_1"):
        load_model(str(path), progress=False, gguf_bits=8)
    assert_nothing_half_written(home, before, good)


def test_a_type_id_unknown_to_the_gguf_package_is_named(home, good, tmp_path):
    """A newer llama.cpp's type: the type code in the tensor's header entry is one no version
    of the `gguf` package here knows."""
    data = bytearray(good.path.read_bytes())
    name = b"blk.0.attn_q.weight"
    entry = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, entry)[0]
    type_at = entry + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, type_at)[0] == good.types[name.decode()].value
    struct.pack_into("<I", data, type_at, 199)
    path = tmp_path / "future.gguf"
    path.write_bytes(bytes(data))
    before = snapshot(home)
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_q\.weight.*unknown GGML type 199"):
        load_model(str(path), progress=False, gguf_bits=8)
    assert_nothing_half_written(home, before, good)


def test_an_ollama_manifest_pointing_at_a_missing_blob(home, good, tmp_path, monkeypatch):
    library = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(library))
    ollama_model(library, "gone", "latest", None)
    ollama_model(library, "tiny-qwen", "q4_k", good.path.read_bytes())
    before = snapshot(home)
    with pytest.raises(ModelNotFoundError, match=r"gone:latest.*sha256-[0-9a-f]{64}.*missing"):
        load_model("ollama:gone", progress=False, gguf_bits=8)
    assert_nothing_half_written(home, before, good)
    # the same library's model with its blob present loads
    loaded = load_model("ollama:tiny-qwen:q4_k", progress=False, gguf_bits=32)
    assert loaded.model_id == "ollama:tiny-qwen:q4_k"
    assert loaded.config["model_type"] == "qwen2"


@pytest.mark.parametrize("text", ["[]", "7", "\"x\"", "[" * 100_000 + "]" * 100_000])
def test_a_conversion_record_that_is_not_an_object_is_converted_again(tmp_path, text):
    """A cached conversion's conversion.json of `[]` was an AttributeError at every load."""
    from engine.gguf_convert import _is_current, read_conversion

    (tmp_path / "conversion.json").write_text(text, encoding="utf-8")
    assert read_conversion(tmp_path) is None and _is_current(tmp_path) is False
