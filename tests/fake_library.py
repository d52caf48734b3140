"""Fake model libraries for the model-choice tests: Ollama's library (manifest JSON naming a
`sha256-<hex>` blob), LM Studio's `publisher/repository/file.gguf` folder and a Hugging Face hub
cache (`models--org--name/snapshots/<revision>/`), laid out as those tools lay them out. They are
fakes of things we do not own; the GGUF files are real, written by the `gguf` package's writer,
with the block and head counts a model's header declares, and small tensors whose sizes set the
parameter count."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType


@dataclass(frozen=True)
class FakeModel:
    """One model of a fake library: its header facts and its parameter count (a power of two)."""

    architecture: str
    name: str
    parameters: int
    file_type: LlamaFileType = LlamaFileType.MOSTLY_F16
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    width: int = 64

    @property
    def kv_values_per_token(self) -> int:
        return self.layers * self.kv_heads * 2 * (self.width // self.heads)


def write_gguf(path: Path, model: FakeModel, *, with_blocks: bool = True) -> bytes:
    """A GGUF with the model's header and float16 tensors holding `parameters` values; its bytes."""
    writer = GGUFWriter(str(path), model.architecture)
    writer.add_name(model.name)
    writer.add_file_type(int(model.file_type))
    if with_blocks:
        writer.add_block_count(model.layers)
        writer.add_head_count(model.heads)
        writer.add_head_count_kv(model.kv_heads)
        writer.add_embedding_length(model.width)
    rows = model.parameters // 256
    writer.add_tensor("token_embd.weight", np.zeros((rows, 256), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def add_ollama(root: Path, name: str, tag: str, data: bytes) -> Path:
    """One Ollama model: the manifest and the blob it names; returns the blob."""
    digest = hashlib.sha256(data).hexdigest()
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)}]}))
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(exist_ok=True)
    blob.write_bytes(data)
    return blob


def add_mlx_snapshot(hub: Path, repo: str, model: FakeModel, bits: int | None = None) -> Path:
    """An mlx-lm directory in the hub cache: config.json and one safetensors file with
    `parameters` values (packed 32 / bits to a uint32 word when `bits` is set)."""
    import mlx.core as mx

    folder = hub / f"models--{repo.replace('/', '--')}" / "snapshots" / "0123abcd"
    folder.mkdir(parents=True)
    config = {"model_type": model.architecture, "_name_or_path": repo, "num_hidden_layers": model.layers,
              "num_attention_heads": model.heads, "num_key_value_heads": model.kv_heads, "hidden_size": model.width}
    rows, columns = model.parameters // 256, 256
    if bits:
        config["quantization"] = {"group_size": 64, "bits": bits}
        tensors = {"model.embed_tokens.weight": mx.zeros((rows, columns * bits // 32), dtype=mx.uint32),
                   "model.embed_tokens.scales": mx.zeros((rows, columns // 64), dtype=mx.float16),
                   "model.embed_tokens.biases": mx.zeros((rows, columns // 64), dtype=mx.float16)}
    else:
        tensors = {"model.embed_tokens.weight": mx.zeros((rows, columns), dtype=mx.float16)}
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    return folder
