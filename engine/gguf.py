"""Load a llama-architecture GGUF file into mlx-lm, or convert it to an mlx-lm directory.

`mx.load` reads GGUF natively: quantized tensors arrive as (weight, scales,
biases) triples in MLX's affine format (Q4_1 and Q8_0 map onto it exactly),
metadata scalars as 0-d arrays. This module renames the tensors to mlx-lm's
llama layout, derives the config from the metadata and rebuilds the tokenizer
with the `tokenizers` library (transformers' GGUF path needs torch).
"""
from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from engine.errors import ModelLoadError
from engine.gguf_tokenizer import gguf_tokenizer, tokenizer_config
from engine.loaded_model import LoadedModel, file_edges_hash, weight_dtype
from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_FILE_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")
"""GGUF file types (`general.file_type`, llama.cpp's names) whose tensors `mx.load` reads."""
_QUANT_PARTS = ("scales", "biases")
_GROUP_SIZE = 32  # every quantized GGUF type mx.load reads packs blocks of 32

# GGUF tensor name (after "blk.N.") -> mlx-lm llama module path (after "model.layers.N.").
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|scales|biases|bias)$")


def read_gguf(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Read a GGUF's tensors and metadata (scalars unwrapped to Python values).

    Raises:
        ModelLoadError: The file is truncated, corrupt or not GGUF.
    """
    try:
        # format named: an Ollama blob (`sha256-<hex>`) has no extension to infer it from
        tensors, metadata = mx.load(str(path), format="gguf", return_metadata=True)
    except (RuntimeError, ValueError, OSError) as err:
        raise ModelLoadError(f"cannot read GGUF file {path}: {err}") from err
    unwrapped = {
        key: value.item() if isinstance(value, mx.array) and value.ndim == 0 else value
        for key, value in metadata.items()
    }
    return tensors, unwrapped


def gguf_config(metadata: dict[str, Any], tensors: dict[str, mx.array]) -> dict[str, Any]:
    """An mlx-lm/HF-style config.json for a llama GGUF.

    Raises:
        ModelLoadError: The architecture is not supported.
    """
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    try:
        hidden = int(metadata[f"{arch}.embedding_length"])
        heads = int(metadata[f"{arch}.attention.head_count"])
        config = {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": hidden,
            "num_hidden_layers": int(metadata[f"{arch}.block_count"]),
            "intermediate_size": int(metadata[f"{arch}.feed_forward_length"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(metadata.get(f"{arch}.attention.head_count_kv", heads)),
            "head_dim": int(metadata.get(f"{arch}.attention.key_length", hidden // heads)),
            "rms_norm_eps": float(metadata[f"{arch}.attention.layer_norm_rms_epsilon"]),
            "rope_theta": float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            # llama.cpp's converter permutes Q/K rows for its interleaved RoPE.
            "rope_traditional": True,
            "max_position_embeddings": int(metadata[f"{arch}.context_length"]),
            "vocab_size": len(metadata["tokenizer.ggml.tokens"]),
            "tie_word_embeddings": "output.weight" not in tensors,
            "bos_token_id": _optional_int(metadata.get("tokenizer.ggml.bos_token_id")),
            "eos_token_id": _optional_int(metadata.get("tokenizer.ggml.eos_token_id")),
        }
    except KeyError as err:
        raise ModelLoadError(f"GGUF metadata lacks {err.args[0]!r}") from err
    return config


def mlx_tensors(tensors: dict[str, mx.array], dtype: mx.Dtype | None) -> dict[str, mx.array]:
    """Rename GGUF tensors to mlx-lm's llama names; dequantize to `dtype` unless None.

    With `dtype` None quantized tensors stay (weight, scales, biases) triples.
    Dequantization uses `dtype` scales, so float32 output is exact.
    """
    renamed: dict[str, mx.array] = {}
    for name, value in tensors.items():
        match = _TENSOR.match(name)
        table = _BLOCK_NAMES if match and match.group(1) else _TOP_NAMES
        if not match or match.group(2) not in table:
            raise ModelLoadError(f"unexpected tensor {name!r} in a llama GGUF")
        block, module, part = match.groups()
        prefix = f"model.layers.{block}." if block else ""
        renamed[f"{prefix}{table[module]}.{part}"] = value
    if dtype is None:
        return renamed
    return _dequantized(renamed, dtype)


def _dequantized(weights: dict[str, mx.array], dtype: mx.Dtype) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for name, value in weights.items():
        module, part = name.rsplit(".", 1)
        if part in _QUANT_PARTS:
            continue
        scales = weights.get(f"{module}.scales")
        if part == "weight" and scales is not None:
            value = mx.dequantize(
                value,
                scales.astype(dtype),
                weights[f"{module}.biases"].astype(dtype),
                group_size=_GROUP_SIZE,
                bits=_bits(value, scales),
            )
        out[name] = value.astype(dtype)
    return out


def _bits(weight: mx.array, scales: mx.array) -> int:
    """Bits per value of a packed uint32 weight (GGUF blocks are 32 values each)."""
    in_dims = scales.shape[-1] * _GROUP_SIZE
    return weight.shape[-1] * 32 // in_dims


def load_gguf(path: Path, *, model_id: str | None = None, weight_hash: str | None = None) -> LoadedModel:
    """Load a llama GGUF straight into an mlx-lm model.

    Weights are dequantized to `weight_dtype()` when that is set (CPU), and
    kept quantized per module (bits and group size read from the tensors) otherwise.

    Raises:
        ModelLoadError: Truncated or corrupt file, unsupported architecture or tokenizer.
    """
    path = Path(path)
    tensors, metadata = read_gguf(path)
    config = gguf_config(metadata, tensors)
    dtype = weight_dtype()
    weights = mlx_tensors(tensors, dtype)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    if dtype is None:
        nn.quantize(model, class_predicate=lambda p, m: _quant_params(p, m, weights))
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as err:
        raise ModelLoadError(f"GGUF {path} does not match its llama config: {err}") from err
    model.eval()
    mx.eval(model.parameters())
    hf = gguf_tokenizer(metadata)
    return LoadedModel(
        model=model,
        tokenizer=Tokenizer.from_hf(hf, eos_token_ids=_eos_ids(config)),
        model_id=model_id or path.stem,
        weight_hash=weight_hash or file_edges_hash(path),
        context_length=config["max_position_embeddings"],
        path=path,
        config=config,
    )


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Write a llama GGUF as an mlx-lm model directory, atomically.

    The directory holds config.json, model.safetensors (weights dequantized to
    float32, exactly), tokenizer.json and tokenizer_config.json (with the chat
    template and special tokens). It is written next to `out_dir` under a
    temporary name and renamed into place, so `out_dir` is complete or absent.

    Args:
        gguf_path: The GGUF file.
        out_dir: The directory to create; must not exist yet.

    Returns:
        `out_dir`.

    Raises:
        ModelLoadError: The GGUF cannot be read or is unsupported.
        FileExistsError: `out_dir` already exists.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists")
    tensors, metadata = read_gguf(Path(gguf_path))
    config = gguf_config(metadata, tensors)
    weights = mlx_tensors(tensors, mx.float32)
    hf = gguf_tokenizer(metadata)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        mx.save_safetensors(str(staging / "model.safetensors"), weights, metadata={"format": "mlx"})
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        hf.backend_tokenizer.save(str(staging / "tokenizer.json"))
        (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(hf, metadata), indent=2))
        staging.chmod(0o755)  # mkdtemp creates it private
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("converted %s to %s", gguf_path, out_dir)
    return out_dir


def _quant_params(path: str, module: nn.Module, weights: dict[str, mx.array]) -> dict | bool:
    scales = weights.get(f"{path}.scales")
    if scales is None or not hasattr(module, "to_quantized"):
        return False
    return {"group_size": _GROUP_SIZE, "bits": _bits(weights[f"{path}.weight"], scales)}


def _eos_ids(config: dict[str, Any]) -> list[int]:
    eos = config.get("eos_token_id")
    return [] if eos is None else [eos]


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
