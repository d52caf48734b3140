"""GGUF loading and conversion: tiny llama GGUFs written with mx.save_gguf, plus the real default model.

Architectures and quantisation types beyond these: tests/engine/test_gguf_archs.py."""
from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm import generate
from mlx_lm.models import llama
from tiny_models import CHAT_TEMPLATE, llama_config, train_tokenizer

import engine.loading
from engine.default_model import GGUF_NAME
from engine.errors import ModelLoadError
from engine.gguf_arch import ARCHITECTURES
from engine.gguf_convert import convert_gguf, converted_dir
from engine.loading import load_gguf, load_model

_TO_GGUF = {v: k for k, v in {**ARCHITECTURES["llama"].block_names, "token_embd": "model.embed_tokens",
                              "output_norm": "model.norm", "output": "lm_head"}.items()}
TEXT = "def greet(name):\n    return f'Grüße, {name}!' 🙂 42"


def _gguf_name(mlx_name: str) -> str:
    module, part = mlx_name.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, block, rest = module.split(".", 3)
        return f"blk.{block}.{_TO_GGUF[rest]}.{part}"
    return f"{_TO_GGUF[module]}.{part}"


def write_tiny_gguf(path: Path, architecture: str = "llama") -> tuple[Path, llama.Model]:
    """A float32 llama GGUF in llama.cpp's layout; returns it and the model it was made from."""
    tok = train_tokenizer(512)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    config = llama_config(vocab_size=len(tokens), hidden_size=64, intermediate_size=128)
    mx.random.seed(3)
    source = llama.Model(llama.ModelArgs.from_dict({**config, "rope_traditional": True}))
    tensors = {_gguf_name(k): v * 2.0 for k, v in tree_flatten(source.parameters())}
    source.load_weights([(k, v * 2.0) for k, v in tree_flatten(source.parameters())])
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    metadata = {
        "general.architecture": architecture,
        f"{architecture}.embedding_length": u32(64),
        f"{architecture}.block_count": u32(2),
        f"{architecture}.feed_forward_length": u32(128),
        f"{architecture}.attention.head_count": u32(2),
        f"{architecture}.attention.head_count_kv": u32(1),
        f"{architecture}.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        f"{architecture}.rope.freq_base": mx.array(10000.0),
        f"{architecture}.context_length": u32(4096),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array(
            [3 if t.startswith("<|") else 1 for t in tokens], dtype=mx.int32
        ),
        "tokenizer.ggml.eos_token_id": u32(vocab["<|im_end|>"]),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    mx.save_gguf(str(path), tensors, metadata)
    return path, source


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, llama.Model]:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_gguf_model_reproduces_its_source_model(tiny_gguf):
    path, source = tiny_gguf
    loaded = load_model(str(path), progress=False, gguf_bits=32)
    ids = mx.array([loaded.tokenizer.encode(TEXT)])
    assert loaded.config["rope_traditional"] is True
    assert loaded.context_length == 4096
    assert mx.array_equal(loaded.model(ids), source(ids))
    # converted once into the cache; the second load reads the conversion
    assert converted_dir(path, 32).is_dir()
    again = load_model(str(path), progress=False, gguf_bits=32)
    assert again.weight_hash == loaded.weight_hash and mx.array_equal(again.model(ids), source(ids))


def test_requantized_weights_stay_close_and_name_their_bits(tiny_gguf):
    path, source = tiny_gguf
    ids = mx.array([load_gguf(path, bits=32, progress=False).tokenizer.encode(TEXT)])
    expected = source(ids)
    hashes = set()
    for bits in (8, 4):
        loaded = load_gguf(path, bits=bits, progress=False)
        hashes.add(loaded.weight_hash)
        quantization = loaded.config["quantization"]
        assert (quantization["group_size"], quantization["bits"]) == (32, bits)
        # a float32 file is finer than 4 bits: its matrices stay at 8 even for a 4-bit target
        assert quantization.get("model.layers.1.mlp.down_proj", quantization)["bits"] == 8
        weight = source.model.layers[1].mlp.down_proj.weight
        groups = weight.reshape(weight.shape[0], -1, 32)
        level = (groups.max(-1, keepdims=True) - groups.min(-1, keepdims=True)) / 255
        off = mx.abs(loaded.model.model.layers[1].mlp.down_proj.weight.reshape(groups.shape) - groups)
        largest = mx.abs(groups).max(-1, keepdims=True)
        assert (off <= level * 0.5 + largest * 2.0**-8).all().item()  # half a level + float16 scale and bias
        assert loaded_error(loaded.model(ids), expected) < 0.1  # relative RMS; measured 0.03
    assert len(hashes) == 2  # checkpoints of two conversions never mix


def loaded_error(logits: mx.array, expected: mx.array) -> float:
    return (mx.sqrt(((logits - expected) ** 2).mean()) / mx.sqrt((expected ** 2).mean())).item()


def test_gguf_tokenizer_matches_the_original_tokenizer(tiny_gguf):
    path, _ = tiny_gguf
    tokenizer = load_gguf(path, progress=False).tokenizer
    original = train_tokenizer(512)
    assert tokenizer.encode(TEXT) == original.encode(TEXT).ids
    assert tokenizer.encode("<|im_start|>user") == [original.token_to_id("<|im_start|>"),
                                                    *original.encode("user").ids]
    # the named eos and the vocabulary's other end-of-turn marker (llama.cpp stops on both)
    assert tokenizer.eos_token_ids == {original.token_to_id("<|im_end|>"), original.token_to_id("<|endoftext|>")}
    assert tokenizer.render_chat([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


def test_converted_directory_loads_with_same_logits_and_fingerprint(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    out = convert_gguf(path, tmp_path / "converted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted"]  # no staging left
    from_dir = load_model(str(out), progress=False)
    from_gguf = load_gguf(path, bits=32, progress=False)
    ids = mx.array([from_gguf.tokenizer.encode(TEXT)])
    assert mx.allclose(from_dir.model(ids), from_gguf.model(ids), atol=1e-5)
    assert from_dir.tokenizer.fingerprint == from_gguf.tokenizer.fingerprint
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_convert_refuses_to_overwrite(tiny_gguf, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        convert_gguf(tiny_gguf[0], tmp_path / "out")


def test_unsupported_architecture_is_named(tmp_path):
    path, _ = write_tiny_gguf(tmp_path / "mamba.gguf", architecture="mamba")
    with pytest.raises(ModelLoadError, match="'mamba'"):
        load_model(str(path), progress=False)
    with pytest.raises(ModelLoadError, match="'mamba'"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_gguf_is_a_clear_load_error(tiny_gguf, tmp_path):
    data = tiny_gguf[0].read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(str(truncated), progress=False)
    target = converted_dir(truncated, 8)
    assert not [p for p in target.parent.glob(f"*{target.name}*") if p.is_dir()]  # no entry, no staging


def test_a_damaged_conversion_is_converted_again(tiny_gguf, caplog):
    path, source = tiny_gguf
    load_gguf(path, bits=32, progress=False)
    directory = converted_dir(path, 32)
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    loaded = load_gguf(path, bits=32, progress=False)
    assert "converting again" in caplog.text
    ids = mx.array([loaded.tokenizer.encode(TEXT)])
    assert mx.array_equal(loaded.model(ids), source(ids))


@pytest.mark.default_model
def test_default_gguf_answers_paris(default_model_path):
    loaded = load_model(str(default_model_path / GGUF_NAME), progress=False)
    prompt = loaded.tokenizer.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    # mlx-lm's generate is greedy by default.
    answer = generate(loaded.model, loaded.tokenizer.wrapper, loaded.tokenizer.encode(prompt),
                      max_tokens=10, verbose=False)
    assert "Paris" in answer


@pytest.mark.default_model
def test_default_converted_directory_matches_gguf(default_model_path, monkeypatch):
    from_dir = load_model(str(default_model_path), progress=False)
    from_gguf = load_gguf(default_model_path / GGUF_NAME, bits=32, progress=False)
    ids = mx.array([from_gguf.tokenizer.encode("The capital of France is")])
    expected = from_gguf.model(ids)
    assert mx.array_equal(from_dir.model(ids), expected)  # both are the exact float32 values
    assert from_dir.tokenizer.fingerprint == from_gguf.tokenizer.fingerprint
    # Where weights stay quantized (GPU), the model keeps MLX's affine layers at the chosen bits.
    monkeypatch.setattr(engine.loading, "weight_dtype", lambda: None)
    quantized = load_gguf(default_model_path / GGUF_NAME, bits=8, progress=False)
    assert isinstance(quantized.model.model.embed_tokens, nn.QuantizedEmbedding)
    assert quantized.model.model.layers[0].mlp.down_proj.bits == 8
    logits = quantized.model(ids)
    assert mx.array_equal(mx.argmax(logits[0, -1]), mx.argmax(expected[0, -1]))
    assert loaded_error(logits.astype(mx.float32), expected) < 0.05  # float16 compute, 8-bit weights
