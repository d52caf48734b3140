"""How big a model is: its parameter count and the shape of its KV cache, from a GGUF header
(`engine.gguf_read`) or an mlx-lm directory (`config.json` and the `*.safetensors` headers: an
8-byte length, then JSON), without reading the weights.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError

_NAME_KEYS = ("general.name", "general.basename", "general.finetune", "general.size_label")


@dataclass(frozen=True)
class ModelShape:
    """What memory a model needs, besides its file.

    Attributes:
        parameters: Weights, counted as values (a 4-bit packed weight counts its values).
        layers: Transformer blocks.
        kv_values_per_token: Key and value entries one token adds to the cache, over all layers.
        names: The model's own names (GGUF `general.*`), lower case, for recognising its family.
    """

    parameters: int
    layers: int
    kv_values_per_token: int
    names: str = ""


def gguf_shape(path: Path, header: Any = None) -> ModelShape:
    """The shape a GGUF header declares.

    Args:
        path: The GGUF file.
        header: Its header already parsed (`engine.gguf_read.GgufFile`); parsed here when None.

    Raises:
        ModelLoadError: Not GGUF, truncated, or lacking the block and head counts.
    """
    from engine.gguf_read import open_gguf  # header parsed, tensor data memory-mapped, not read

    opened = header if header is not None else open_gguf(path)
    metadata = opened.metadata
    arch = metadata.get("general.architecture")
    try:
        layers = int(metadata[f"{arch}.block_count"])
        heads = metadata[f"{arch}.attention.head_count"]
        kv_heads = metadata.get(f"{arch}.attention.head_count_kv", heads)
        width = int(metadata[f"{arch}.embedding_length"])
    except (KeyError, TypeError, ValueError) as err:
        raise ModelLoadError(f"GGUF {path} does not declare {err} for its {arch} blocks") from err
    per_layer_heads = heads if isinstance(heads, list) else [heads] * layers
    per_layer_kv = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    key = metadata.get(f"{arch}.attention.key_length")
    value = metadata.get(f"{arch}.attention.value_length")
    kv = 0
    for h, kvh in zip(per_layer_heads, per_layer_kv):
        head_dim = width // max(int(h), 1)
        kv += int(kvh) * (int(key or head_dim) + int(value or head_dim))
    names = " ".join(str(metadata[k]) for k in _NAME_KEYS if isinstance(metadata.get(k), str)).lower()
    return ModelShape(sum(math.prod(t.shape) for t in opened.tensors), layers, kv, names)


def directory_shape(folder: Path) -> ModelShape:
    """The shape of an mlx-lm directory, from config.json and the safetensors headers.

    Raises:
        ModelLoadError: config.json or a safetensors header is unreadable, or lacks the counts.
    """
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        text = config.get("text_config") or config  # multimodal configs nest the language model
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        bits = int((config.get("quantization") or {}).get("bits") or 0)
        parameters = sum(_safetensors_values(path, bits) for path in sorted(folder.glob("*.safetensors")))
    except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
        raise ModelLoadError(f"cannot read the shape of {folder}: {err}") from err
    names = str(config.get("_name_or_path") or "").lower()
    return ModelShape(parameters, layers, layers * kv_heads * 2 * head_dim, names)


def _safetensors_values(path: Path, bits: int) -> int:
    """Values in one safetensors file; packed quantised weights count 32 / bits values a word."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    total = 0
    for name, entry in header.items():
        if name == "__metadata__" or name.endswith((".scales", ".biases")):
            continue
        values = math.prod(entry["shape"])
        packed = bits and entry["dtype"] == "U32" and f"{name.rsplit('.', 1)[0]}.scales" in header
        total += values * 32 // bits if packed else values
    return total
