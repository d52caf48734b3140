"""A loaded model and what every loader needs: the weight dtype, the cast, the
context length and the weight hashes that checkpoint keys are built from."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import xxhash
from mlx_lm.utils import dequantize_model

from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_FALLBACK_CONTEXT_LENGTH = 4096
_HASH_EDGE_BYTES = 1 << 20


@dataclass
class LoadedModel:
    """A model ready for the engine.

    Attributes:
        model: The mlx-lm model (``model(inputs, cache=...)`` gives logits).
        tokenizer: The model's tokenizer.
        model_id: A short stable name ("smollm2-135m", a hub id, a directory name).
        weight_hash: Identifies the weights; part of every checkpoint key.
        context_length: The model's trained context window in tokens.
        path: Where the weights were loaded from.
        config: The model's config.json contents (as mlx-lm parsed them).
    """

    model: nn.Module
    tokenizer: Tokenizer
    model_id: str
    weight_hash: str
    context_length: int
    path: Path
    config: dict[str, Any]


def weight_dtype() -> mx.Dtype | None:
    """The dtype weights are converted to after loading, or None to keep the checkpoint's.

    On the CPU backend quantized and half-precision matmuls are far slower than
    float32 (docs/benchmarks.md, "Engine (CPU)"), so CPU models are dequantized to float32. Elsewhere
    the checkpoint's own dtype and quantization are kept.
    """
    if mx.default_device().type == mx.DeviceType.cpu:
        return mx.float32
    return None


def cast_weights(model: nn.Module, dtype: mx.Dtype | None) -> nn.Module:
    """Dequantize `model` and cast its floating weights to `dtype` (no-op for None)."""
    if dtype is None:
        return model
    model = dequantize_model(model)
    model.set_dtype(dtype)
    return model


def context_length_of(config: dict[str, Any]) -> int:
    """The trained context window a config declares (a fallback when it declares none)."""
    for source in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "max_seq_len", "n_ctx", "seq_length"):
            if isinstance(source.get(key), int) and source[key] > 0:
                return source[key]
    log.warning("config declares no context length; assuming %d", _FALLBACK_CONTEXT_LENGTH)
    return _FALLBACK_CONTEXT_LENGTH


def weight_files_hash(directory: Path) -> str:
    """A cheap, stable hash of a model directory's weights.

    xxh3_64 over config.json and, per ``*.safetensors`` / ``*.gguf`` file in name
    order, its name, size and first and last MiB. Catches a changed or swapped
    file without reading gigabytes.
    """
    digest = xxhash.xxh3_64()
    config = directory / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    files = sorted([*directory.glob("*.safetensors"), *directory.glob("*.gguf")])
    for file in files:
        _update_with_file_edges(digest, file)
    return digest.hexdigest()


def file_edges_hash(file: Path) -> str:
    """`weight_files_hash` for a single file (a GGUF)."""
    digest = xxhash.xxh3_64()
    _update_with_file_edges(digest, file)
    return digest.hexdigest()


def _update_with_file_edges(digest: Any, file: Path) -> None:
    size = file.stat().st_size
    digest.update(f"{file.name}\0{size}\0".encode())
    with open(file, "rb") as handle:
        digest.update(handle.read(_HASH_EDGE_BYTES))
        if size > _HASH_EDGE_BYTES:
            handle.seek(max(_HASH_EDGE_BYTES, size - _HASH_EDGE_BYTES))
            digest.update(handle.read())
