"""Resolve a model spec to a loaded model: the default, a directory, a GGUF or a hub id.

`load_model` is the one entry point. Whatever the source, the result is a
`LoadedModel` with an mlx-lm `nn.Module`, the engine's `Tokenizer` and the
identity (model id, weight hash) that checkpoint keys are built from.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import xxhash
from mlx_lm.utils import dequantize_model
from mlx_lm.utils import load_model as mlx_load_model
from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

from engine.errors import ModelLoadError, ModelNotFoundError
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
_FALLBACK_CONTEXT_LENGTH = 4096
_HASH_EDGE_BYTES = 1 << 20
_HUB_FILES = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]


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


def load_model(spec: str | None = None, *, progress: bool = True) -> LoadedModel:
    """Load a model by name, path or hub id.

    Args:
        spec: None or "smollm2-135m" for the default model; a directory holding
            an mlx-lm model (config.json + safetensors + tokenizer files); a path
            ending in ``.gguf``; otherwise a Hugging Face hub id (from the local
            hub cache, or downloaded where the hub is reachable).
        progress: Show a progress bar on stderr while fetching or converting.

    Returns:
        The loaded model.

    Raises:
        ModelNotFoundError: Nothing matches `spec`.
        ModelLoadError: The files exist but cannot be loaded (unsupported
            architecture, bad or truncated files, checksum mismatch).
    """
    if spec is None or spec == DEFAULT_MODEL:
        from engine.default_model import ensure_default_model

        default = ensure_default_model(progress=progress)
        return load_directory(default.directory, model_id=DEFAULT_MODEL, weight_hash=default.sha256)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        from engine.gguf import load_gguf

        return load_gguf(path)
    if path.is_dir():
        return load_directory(path)
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelNotFoundError(f"not a model directory or .gguf file: {spec}")
    return load_directory(_hub_snapshot(spec), model_id=spec)


def load_directory(
    path: Path, *, model_id: str | None = None, weight_hash: str | None = None
) -> LoadedModel:
    """Load an mlx-lm model directory (config.json, model*.safetensors, tokenizer files).

    Args:
        path: The directory.
        model_id: Name to report; defaults to the directory's name.
        weight_hash: A known hash of the weights; computed cheaply when None.

    Returns:
        The loaded model, converted to `weight_dtype()` when that is set.

    Raises:
        ModelNotFoundError: `path` has no config.json.
        ModelLoadError: The architecture is unsupported or the files are bad.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"no config.json in {path}: not an mlx-lm model directory")
    try:
        model, config = mlx_load_model(path, lazy=True)
        wrapper = mlx_load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise ModelLoadError(f"cannot load model from {path}: {err}") from err
    model = cast_weights(model, weight_dtype())
    mx.eval(model.parameters())
    return LoadedModel(
        model=model,
        tokenizer=Tokenizer(wrapper),
        model_id=model_id or path.name,
        weight_hash=weight_hash or weight_files_hash(path),
        context_length=context_length_of(config),
        path=path,
        config=config,
    )


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


def _hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of a hub repo: from the hub cache, else downloaded.

    Downloads only when ``HF_HUB_OFFLINE`` is unset; a hub that cannot be
    reached fails fast with ModelNotFoundError instead of hanging.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError) as err:
        if _hub_offline():
            raise ModelNotFoundError(
                f"{repo_id!r} is not a local path and not in the Hugging Face cache "
                "(HF_HUB_OFFLINE is set, so it was not downloaded)"
            ) from err
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES, etag_timeout=10))
    except (HfHubHTTPError, LocalEntryNotFoundError, ValueError, OSError) as err:
        raise ModelNotFoundError(
            f"{repo_id!r} is not a local path and could not be fetched from the "
            f"Hugging Face hub: {err}"
        ) from err


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
