"""Resolve a model spec to a loaded model: the default, a directory, a GGUF or a hub id.

`load_model` is the one entry point. Whatever the source, the result is a
`LoadedModel` with an mlx-lm `nn.Module`, the engine's `Tokenizer` and the
identity (model id, weight hash) that checkpoint keys are built from.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model as mlx_load_model
from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

from engine.errors import ModelLoadError, ModelNotFoundError
from engine.loaded_model import (LoadedModel, cast_weights, context_length_of, file_edges_hash, weight_dtype,
                                 weight_files_hash)
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
_HUB_FILES = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]


def load_model(spec: str | None = None, *, progress: bool = True, gguf_bits: int | None = None) -> LoadedModel:
    """Load a model by name, path or hub id.

    Args:
        spec: None or "smollm2-135m" for the default model; a directory holding
            an mlx-lm model (config.json + safetensors + tokenizer files); a path
            ending in ``.gguf``; otherwise a Hugging Face hub id (from the local
            hub cache, or downloaded where the hub is reachable).
        progress: Show a progress bar on stderr while fetching or converting.
        gguf_bits: What a GGUF's weights are converted to: 4 or 8 (MLX affine), 16 (float16)
            or 32 (float32); None for `engine.gguf.DEFAULT_GGUF_BITS`. Other sources ignore it.

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
    from engine.model_library import resolve_spec

    found = resolve_spec(spec)  # ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO[/FILE]
    if found is not None:
        return load_gguf(found, model_id=spec, bits=gguf_bits, progress=progress)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return load_gguf(path, bits=gguf_bits, progress=progress)
    if path.is_dir():
        return load_directory(path)
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelNotFoundError(f"not a model directory or .gguf file: {spec}")
    return load_directory(_hub_snapshot(spec), model_id=spec)


def load_gguf(path: Path, *, model_id: str | None = None, bits: int | None = None,
              progress: bool = True) -> LoadedModel:
    """Load a GGUF file, converting it into the cache first when needed.

    Args:
        path: The GGUF file (any name: Ollama's blobs have no extension).
        model_id: Name to report; defaults to the file's stem.
        bits: 4 or 8 (MLX affine), 16 (float16) or 32 (float32); None for `DEFAULT_GGUF_BITS`.
        progress: Show a progress bar on stderr while converting.

    Raises:
        ModelLoadError: Truncated or corrupt file, unsupported architecture,
            tensor type or tokenizer (nothing half-written is left in the cache).
    """
    from engine.gguf import DEFAULT_GGUF_BITS, GGUF_BITS
    from engine.gguf_convert import ensure_converted

    path = Path(path)
    bits = DEFAULT_GGUF_BITS if bits is None else bits
    if bits not in GGUF_BITS:
        raise ValueError(f"bits must be one of {GGUF_BITS}, got {bits}")
    directory = ensure_converted(path, bits, progress=progress)
    # the source file's identity and the bits: checkpoints of two conversions never mix
    weight_hash = f"{file_edges_hash(path)}-b{bits}"
    loaded = load_directory(directory, model_id=model_id or path.stem, weight_hash=weight_hash)
    loaded.path = path
    return loaded


def load_tokenizer(spec: str | None = None) -> tuple[Tokenizer, str, int]:
    """The tokenizer, model id and context length of a model, without its weights (what a
    remote engine's client needs to lay out prompts). `spec` as in `load_model`; a `.gguf`
    is not read this way yet.

    Raises:
        ModelNotFoundError: Nothing matches `spec`.
        ModelLoadError: The files exist but hold no usable tokenizer.
    """
    if spec is None or spec == DEFAULT_MODEL:
        from engine.default_model import ensure_default_model

        path, model_id = ensure_default_model(progress=False).directory, DEFAULT_MODEL
    else:
        path = Path(spec).expanduser()
        if path.suffix.lower() == ".gguf":
            raise ModelLoadError(f"{spec}: a remote engine's tokenizer comes from a model directory, not a .gguf")
        path = path if path.is_dir() else _hub_snapshot(spec)
        model_id = spec if not Path(spec).expanduser().is_dir() else path.name
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelNotFoundError(f"no config.json in {path}: not an mlx-lm model directory")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        wrapper = mlx_load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise ModelLoadError(f"cannot load the tokenizer from {path}: {err}") from err
    return Tokenizer(wrapper), model_id, context_length_of(config)


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
