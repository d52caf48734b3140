"""What each GGUF architecture means in mlx-lm terms: its config and its tensor names.

llama.cpp's converter writes Hugging Face checkpoints into GGUF with a few
conventions this module undoes: its own tensor names (`blk.N.attn_q`), the
config as `{arch}.*` metadata keys, Gemma's RMSNorm weights stored with the
+1 that Gemma applies at run time folded in, and for llama the Q/K rows
permuted for interleaved RoPE (kept as they are here: `rope_traditional` makes
mlx-lm rotate interleaved pairs, which is the same computation).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from engine.errors import ModelLoadError
from engine.gguf_tokenizer import eos_token_ids


@dataclass(frozen=True)
class Architecture:
    """How one GGUF architecture maps onto an mlx-lm model.

    Attributes:
        model_type: mlx-lm's model type (its module under `mlx_lm.models`).
        block_names: GGUF block tensor (after "blk.N.") -> mlx-lm module (after "model.layers.N.").
        extra_config: Builds the architecture's own config keys from the metadata.
        norm_shift: Subtracted from every norm weight (Gemma's folded-in +1).
    """

    model_type: str
    block_names: dict[str, str]
    extra_config: Callable[[dict[str, Any], str], dict[str, Any]]
    norm_shift: float = 0.0


_ATTENTION = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj"}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_LLAMA_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_GEMMA3_NORMS = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_SKIPPED = {"rope_freqs"}  # llama 3's precomputed RoPE factors: handled as config (see _llama)
_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?([a-z0-9_]+)\.(weight|bias)$")
_GEMMA3_PATTERN = 6  # every sixth layer is global; llama.cpp fixes it for gemma3 as well
_GEMMA3_LOCAL_BASE = 10000.0  # RoPE base of gemma3's sliding layers (llama.cpp fixes it too)
_LLAMA3_ROPE = (  # (factor, low_freq_factor, high_freq_factor, original context) of Llama 3.1 and 3.2
    (8.0, 1.0, 4.0, 8192),
    (32.0, 1.0, 4.0, 8192),
)


def _rope_scaling(meta: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
    scaling: dict[str, Any] = {"type": kind, "rope_type": kind, "factor": factor}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original:
        scaling["original_max_position_embeddings"] = int(original)
    if kind not in ("linear", "yarn"):
        raise ModelLoadError(f"unsupported RoPE scaling {kind!r} in a {arch} GGUF")
    return scaling


def _llama(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    return {"rope_traditional": True, "rope_scaling": _rope_scaling(meta, arch)}


def _qwen(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    return {"rope_scaling": _rope_scaling(meta, arch)}


def _gemma3(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    layers, hidden = int(meta[f"{arch}.block_count"]), int(meta[f"{arch}.embedding_length"])
    heads = int(meta[f"{arch}.attention.head_count"])
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    return {
        "sliding_window": int(meta[f"{arch}.attention.sliding_window"]),
        "sliding_window_pattern": _GEMMA3_PATTERN,
        "rope_local_base_freq": _GEMMA3_LOCAL_BASE,
        # the 27B model (62 layers) scales queries by hidden/heads, the others by head_dim
        "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
        "rope_scaling": _rope_scaling(meta, arch),
    }


ARCHITECTURES = {
    "llama": Architecture("llama", {**_ATTENTION, **_MLP, **_LLAMA_NORMS}, _llama),
    "qwen2": Architecture("qwen2", {**_ATTENTION, **_MLP, **_LLAMA_NORMS}, _qwen),
    "qwen3": Architecture("qwen3", {**_ATTENTION, **_MLP, **_LLAMA_NORMS, **_QK_NORMS}, _qwen),
    "gemma3": Architecture("gemma3_text", {**_ATTENTION, **_MLP, **_GEMMA3_NORMS, **_QK_NORMS}, _gemma3,
                           norm_shift=1.0),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


def architecture(meta: dict[str, Any]) -> Architecture:
    """The mapping for the file's `general.architecture`.

    Raises:
        ModelLoadError: The architecture is not one codectx loads.
    """
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return ARCHITECTURES[arch]


def hf_config(meta: dict[str, Any], tensor_names: set[str], vocab_size: int,
              rope_freqs: np.ndarray | None = None) -> dict[str, Any]:
    """The mlx-lm config.json for a GGUF's metadata.

    Args:
        meta: The GGUF metadata.
        tensor_names: Names of the file's tensors.
        vocab_size: Rows of the token embedding.
        rope_freqs: The `rope_freqs.weight` tensor where the file has one (Llama 3.1+).

    Raises:
        ModelLoadError: Unsupported architecture or a required key is missing.
    """
    arch_map, arch = architecture(meta), meta["general.architecture"]
    try:
        hidden = int(meta[f"{arch}.embedding_length"])
        heads = int(meta[f"{arch}.attention.head_count"])
        config = {
            "model_type": arch_map.model_type,
            "hidden_size": hidden,
            "num_hidden_layers": int(meta[f"{arch}.block_count"]),
            "intermediate_size": int(meta[f"{arch}.feed_forward_length"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            "head_dim": int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
            "rms_norm_eps": float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]),
            "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(meta[f"{arch}.context_length"]),
            "vocab_size": vocab_size,
            "tie_word_embeddings": "output.weight" not in tensor_names,
            "bos_token_id": _optional_int(meta.get("tokenizer.ggml.bos_token_id")),
            "eos_token_id": _stop_ids(meta),
        }
        config.update(arch_map.extra_config(meta, arch))
    except KeyError as err:
        raise ModelLoadError(f"GGUF metadata lacks {err.args[0]!r}") from err
    if config.get("rope_scaling") is None:
        config.pop("rope_scaling", None)
    if rope_freqs is not None:
        config["rope_scaling"] = _llama3_scaling(rope_freqs, config)
    return config


def _llama3_scaling(factors: np.ndarray, config: dict[str, Any]) -> dict[str, Any]:
    """Llama 3's RoPE scaling from the per-frequency factors llama.cpp stores precomputed.

    The file keeps only the factors, so they are matched against the parameter sets
    Llama 3.1 and 3.2 were released with, recomputed by the published rule.
    """
    dims = factors.shape[0] * 2
    inverse = 1.0 / config["rope_theta"] ** (np.arange(0, dims, 2, dtype=np.float64) / dims)
    wavelength = 2 * np.pi / inverse
    for factor, low, high, original in _LLAMA3_ROPE:
        smooth = np.clip((original / wavelength - low) / (high - low), 0.0, 1.0)
        expected = 1.0 / ((1 - smooth) / factor + smooth)
        if np.allclose(expected, factors, rtol=1e-3):
            return {"rope_type": "llama3", "type": "llama3", "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": original}
    raise ModelLoadError("the file's precomputed RoPE factors (rope_freqs) match no known Llama 3 scaling")


def hf_name(name: str, arch_map: Architecture) -> str | None:
    """The mlx-lm parameter name of a GGUF tensor; None for tensors the model does not take.

    Raises:
        ModelLoadError: A tensor this architecture does not know.
    """
    match = _TENSOR.match(name)
    if match and match.group(2) in _SKIPPED:
        return None
    block, module, part = match.groups() if match else (None, None, None)
    table = arch_map.block_names if block is not None else _TOP_NAMES
    if module not in table:
        raise ModelLoadError(f"unexpected tensor {name!r} in a {arch_map.model_type} GGUF")
    prefix = f"model.layers.{block}." if block is not None else ""
    return f"{prefix}{table[module]}.{part}"


def hf_values(hf: str, values: np.ndarray, arch_map: Architecture) -> np.ndarray:
    """A tensor's values as the mlx-lm model expects them (Gemma's norm shift undone)."""
    if arch_map.norm_shift and hf.endswith("norm.weight"):
        return values - np.float32(arch_map.norm_shift)
    return values


def _stop_ids(meta: dict[str, Any]) -> int | list[int] | None:
    """End of sequence, end of turn and the vocabulary's turn markers (`eos_token_ids`)."""
    ids = eos_token_ids(meta)
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
