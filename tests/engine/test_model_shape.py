"""A model's size and KV shape from its GGUF header or its mlx-lm directory (nothing of the weights
read), and the machine facts a model choice depends on."""
from __future__ import annotations

import platform

import pytest
from gguf import LlamaFileType

from engine.errors import ModelLoadError
from engine.machine import Machine, this_machine
from engine.model_shape import directory_shape, gguf_shape
from tests.fake_library import FakeModel, add_mlx_snapshot, write_gguf


def test_the_default_models_gguf_and_its_conversion_have_the_same_shape(default_model_path):
    from engine.default_model import GGUF_NAME

    from_gguf = gguf_shape(default_model_path / GGUF_NAME)
    # SmolLM2-135M: 30 blocks of 3 KV heads of 64 values (keys and values), 134,515,008 weights
    assert (from_gguf.parameters, from_gguf.layers, from_gguf.kv_values_per_token) == (134_515_008, 30, 30 * 3 * 2 * 64)
    assert "smollm2" in from_gguf.names
    from_directory = directory_shape(default_model_path)
    assert (from_directory.parameters, from_directory.kv_values_per_token) == (134_515_008, 30 * 3 * 2 * 64)


def test_fake_gguf_and_quantised_directory_shapes(tmp_path):
    model = FakeModel("qwen2", "Qwen2.5 Coder Tiny", 2**18, LlamaFileType.MOSTLY_Q4_K_M, layers=3, heads=8,
                      kv_heads=2, width=128)
    write_gguf(tmp_path / "m.gguf", model)
    shape = gguf_shape(tmp_path / "m.gguf")
    assert (shape.parameters, shape.layers, shape.kv_values_per_token) == (2**18, 3, 3 * 2 * 2 * 16)
    assert "qwen2.5 coder tiny" in shape.names
    folder = add_mlx_snapshot(tmp_path / "hub", "org/Packed-4bit", model, bits=4)
    packed = directory_shape(folder)  # uint32 words of 8 values each count as 8 parameters
    assert (packed.parameters, packed.kv_values_per_token) == (2**18, 3 * 2 * 2 * 16)


def test_bad_files_give_clear_errors(tmp_path):
    headless = FakeModel("qwen2", "no blocks", 2**12)
    write_gguf(tmp_path / "headless.gguf", headless, with_blocks=False)
    with pytest.raises(ModelLoadError, match="does not declare 'qwen2.block_count'"):
        gguf_shape(tmp_path / "headless.gguf")
    data = write_gguf(tmp_path / "whole.gguf", FakeModel("llama", "cut", 2**12))
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError, match="truncated"):
        gguf_shape(tmp_path / "cut.gguf")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="num_hidden_layers"):
        directory_shape(tmp_path / "dir")


def test_this_machine_reads_its_memory():
    machine = this_machine()
    if platform.system() == "Linux":
        meminfo = open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]
        assert 0 < machine.memory_bytes <= int(meminfo) * 1024
        assert not machine.metal and not machine.apple_silicon
    assert machine.memory_bytes > 0
    assert Machine(16 * 1024**3, True, True, "Darwin").describe() == "16.0 GiB, Apple Silicon, Metal"
    assert Machine(None, False, False).describe() == "memory unknown, Linux, CPU"
