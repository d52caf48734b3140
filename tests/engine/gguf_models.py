"""Tiny random-weight GGUF files, written as llama.cpp's converter writes them, and their reference.

`write_gguf(path, arch, qtype)` builds seeded random weights in Hugging Face layout for one of
llama, qwen2, qwen3 or gemma3, applies the GGUF conventions (llama.cpp tensor names, llama's
Q/K row permutation, Gemma's norm weights stored +1, 1-D tensors kept F32), encodes every
matrix in `qtype` with the `gguf` package and writes a real GGUF with the `gguf` package's
writer, metadata keys and tokenizer included.

What the file holds is the truth: the returned `TinyGGUF.weights` are the file's tensors
dequantized with `gguf.quants.dequantize` and the conventions undone, in float32 Hugging Face
layout, so the reference model (`TinyGGUF.reference()`, the mlx-lm model class for the
architecture) is exactly what a correct loader must produce. The `gguf` package quantizes
F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 from floats; for the K-quants it only dequantizes, so their
tensors are random blocks with finite f16 scale fields (`random_k_blocks`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, LlamaFileType, RopeScalingType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize
from gguf_vocab import Vocab, bpe_vocab, sentencepiece_vocab

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
FLOAT_TYPES = (Q.F32, Q.F16, Q.BF16)
BLOCK_TYPES = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)  # the gguf package quantizes these
K_TYPES = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)  # ... and only dequantizes these
ALL_TYPES = FLOAT_TYPES + BLOCK_TYPES + K_TYPES

# `general.file_type` of a file whose matrices are all of one type (K-quants: the "S" mixes).
FILE_TYPES = {
    Q.F32: LlamaFileType.ALL_F32, Q.F16: LlamaFileType.MOSTLY_F16, Q.BF16: LlamaFileType.MOSTLY_BF16,
    Q.Q8_0: LlamaFileType.MOSTLY_Q8_0, Q.Q4_0: LlamaFileType.MOSTLY_Q4_0, Q.Q4_1: LlamaFileType.MOSTLY_Q4_1,
    Q.Q5_0: LlamaFileType.MOSTLY_Q5_0, Q.Q5_1: LlamaFileType.MOSTLY_Q5_1, Q.Q2_K: LlamaFileType.MOSTLY_Q2_K,
    Q.Q3_K: LlamaFileType.MOSTLY_Q3_K_S, Q.Q4_K: LlamaFileType.MOSTLY_Q4_K_S,
    Q.Q5_K: LlamaFileType.MOSTLY_Q5_K_S, Q.Q6_K: LlamaFileType.MOSTLY_Q6_K,
}

# Sizes: every matrix row (hidden, heads * head_dim, intermediate) is a multiple of 256, the
# K-quants' block; Gemma gets six layers so its pattern (five sliding, one global) occurs.
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 2, 1, 128
GEMMA_LAYERS, GEMMA_SLIDING_WINDOW = 6, 4

# RoPE scaling as the released models have it: Llama 3.2's (llama.cpp stores the per-frequency
# factors as the `rope_freqs` tensor) and Gemma 3 4B+'s linear scaling of the global layers.
LLAMA32_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
GEMMA3_ROPE = {"rope_type": "linear", "factor": 8.0}

_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm",
}
# Gemma 3 norms around both sub-layers: HF's post_attention_layernorm is a *post*-norm there.
_GEMMA_BLOCK = {**_BLOCK, "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def hf_config(arch: str, vocab_size: int) -> dict:
    """The Hugging Face / mlx-lm config.json of the tiny model (mlx-lm's `model_type`)."""
    common = {"hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "vocab_size": vocab_size, "num_hidden_layers": 2,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
    if arch == "llama":
        return {**common, "model_type": "llama", "rope_theta": 500000.0, "tie_word_embeddings": False}
    if arch == "qwen2":
        return {**common, "model_type": "qwen2", "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                "tie_word_embeddings": True}
    if arch == "qwen3":
        return {**common, "model_type": "qwen3", "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                "head_dim": HEAD_DIM, "tie_word_embeddings": True}
    if arch == "gemma3":
        # llama.cpp scales queries by 1/sqrt(key_length) for every Gemma 3 but the 27B: the
        # reference's query_pre_attn_scalar is therefore head_dim.
        return {**common, "model_type": "gemma3_text", "num_hidden_layers": GEMMA_LAYERS,
                "head_dim": HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": HEAD_DIM,
                "sliding_window": GEMMA_SLIDING_WINDOW, "sliding_window_pattern": 6,
                "max_position_embeddings": 32768}
    raise ValueError(f"no tiny {arch} model")


def hf_weights(arch: str, config: dict, seed: int) -> dict[str, np.ndarray]:
    """Seeded random float32 weights in Hugging Face names and layout."""
    rng = np.random.default_rng(seed)
    head_dim = config.get("head_dim", HIDDEN // HEADS)
    q_out, kv_out = HEADS * head_dim, KV_HEADS * head_dim

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        # Gemma's RMSNorm multiplies by (1 + w): its weights sit around 0, the others' around 1
        centre = 0.0 if arch == "gemma3" else 1.0
        return (centre + 0.1 * rng.standard_normal(size)).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(config["vocab_size"], HIDDEN) * 4,
               "model.norm.weight": norm(HIDDEN)}
    if not config.get("tie_word_embeddings", True):
        weights["lm_head.weight"] = matrix(config["vocab_size"], HIDDEN)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": norm(HIDDEN),
            p + "self_attn.q_proj.weight": matrix(q_out, HIDDEN),
            p + "self_attn.k_proj.weight": matrix(kv_out, HIDDEN),
            p + "self_attn.v_proj.weight": matrix(kv_out, HIDDEN),
            p + "self_attn.o_proj.weight": matrix(HIDDEN, q_out),
            p + "mlp.gate_proj.weight": matrix(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": matrix(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": matrix(HIDDEN, INTERMEDIATE),
            p + "post_attention_layernorm.weight": norm(HIDDEN),
        })
        if arch == "qwen2":
            for name, size in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                weights[p + f"self_attn.{name}_proj.bias"] = (0.5 * rng.standard_normal(size)).astype(np.float32)
        if arch in ("qwen3", "gemma3"):
            weights[p + "self_attn.q_norm.weight"] = norm(head_dim)
            weights[p + "self_attn.k_norm.weight"] = norm(head_dim)
        if arch == "gemma3":
            weights[p + "pre_feedforward_layernorm.weight"] = norm(HIDDEN)
            weights[p + "post_feedforward_layernorm.weight"] = norm(HIDDEN)
    return weights


def gguf_name(arch: str, hf_name: str) -> str:
    """llama.cpp's tensor name for a Hugging Face one."""
    module, part = hf_name.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, block, rest = module.split(".", 3)
        return f"blk.{block}.{(_GEMMA_BLOCK if arch == 'gemma3' else _BLOCK)[rest]}.{part}"
    return f"{_TOP[module]}.{part}"


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's llama Q/K row order: each head's two rotary halves interleaved row by row."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of `permute_qk`."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_gguf_layout(arch: str, hf_name: str, w: np.ndarray, *, inverse: bool = False) -> np.ndarray:
    """What llama.cpp's converter does to one tensor's values before writing it (`inverse`: undone,
    applied to what the file holds)."""
    for proj, heads in (("q_proj", HEADS), ("k_proj", KV_HEADS)):
        if arch == "llama" and hf_name.endswith(f"self_attn.{proj}.weight"):
            return unpermute_qk(w, heads) if inverse else permute_qk(w, heads)
    if arch == "gemma3" and hf_name.endswith("norm.weight"):
        return w - np.float32(1.0) if inverse else w + np.float32(1.0)
    return w


def from_gguf_layout(arch: str, hf_name: str, w: np.ndarray) -> np.ndarray:
    """The inverse of `to_gguf_layout`, applied to what the file holds."""
    return to_gguf_layout(arch, hf_name, w, inverse=True)


# Per K-quant: byte offsets of the f16 `d` and (where the type has one) `dmin` in a block, and
# the dmin/d ratio that roughly centres the block's values on zero.
_K_SCALE_FIELDS = {Q.Q2_K: (80, 82, 1.5), Q.Q3_K: (108, None, 0.0), Q.Q4_K: (0, 2, 7.5),
                   Q.Q5_K: (0, 2, 15.5), Q.Q6_K: (208, None, 0.0)}


def random_k_blocks(shape: tuple[int, int], qtype: Q, rng: np.random.Generator, std: float) -> np.ndarray:
    """Random valid blocks of a K-quant for a (rows, cols) matrix, as (rows, bytes per row) uint8.

    Every byte is random except the f16 scale fields, set to finite values chosen so that the
    dequantized matrix has roughly standard deviation `std` (each block's scale varies by up to 2x).
    """
    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    n_blocks = rows * cols // block
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d_at, dmin_at, centre = _K_SCALE_FIELDS[qtype]

    def set_scales(d: np.ndarray) -> None:
        blocks[:, d_at:d_at + 2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
        if dmin_at is not None:
            blocks[:, dmin_at:dmin_at + 2] = (d * centre).astype(np.float16).reshape(-1, 1).view(np.uint8)

    set_scales(np.ones(n_blocks, dtype=np.float32))
    unit = dequantize(blocks, qtype).std()
    set_scales((std / unit) * rng.uniform(0.5, 1.0, n_blocks).astype(np.float32))
    return blocks.reshape(rows, cols // block * size)


def encode(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """(what to hand the writer, the values the file will hold) for one tensor of `qtype`.

    A type outside `ALL_TYPES` gets random bytes of the right size and no values: a tensor the
    `gguf` package may not be able to dequantize at all.
    """
    if qtype not in ALL_TYPES:
        block, size = GGML_QUANT_SIZES[qtype]
        return rng.integers(0, 256, size=(w.shape[0], w.shape[1] // block * size), dtype=np.uint8), None
    if qtype == Q.F32:
        data = w.astype(np.float32)
    elif qtype == Q.F16:
        data = w.astype(np.float16)
    elif qtype in K_TYPES:
        data = random_k_blocks(w.shape, qtype, rng, float(w.std()))
    else:
        data = quantize(w, qtype)
    return data, dequantize(data, qtype).reshape(w.shape).astype(np.float32)


@dataclass
class TinyGGUF:
    """A written tiny GGUF and what it holds.

    Attributes:
        path: The file.
        arch: `general.architecture`.
        config: The reference's mlx-lm config.
        weights: The file's tensors dequantized, conventions undone: float32, HF names and layout
            (tensors of a type outside `ALL_TYPES` are left out).
        types: GGML type written per GGUF tensor name.
        vocab: The tokenizer written into the metadata, with its reference.
    """

    path: Path
    arch: str
    config: dict
    weights: dict[str, np.ndarray]
    types: dict[str, Q]
    vocab: Vocab

    def reference(self, bits: int = 32) -> nn.Module:
        """The mlx-lm model, in float32, built from `weights` at `bits`.

        Args:
            bits: 32 for the weights as they are; 16 for every weight rounded to float16 (a
                float16 checkpoint); 4 or 8 for that float16 checkpoint with its Linear and
                Embedding weights quantized as mlx-lm quantizes one (`mx.quantize`, group
                size 32, float16 scales and biases) and dequantized back. What a loader that
                converts to `bits` must hold.
        """
        module = importlib.import_module(f"mlx_lm.models.{self.config['model_type']}")
        model = module.Model(module.ModelArgs.from_dict(self.config))
        weights = model.sanitize({k: mx.array(v) for k, v in self.weights.items()})
        if bits < 32:
            weights = {k: requantized(v, bits) if bits < 16 and v.ndim == 2 else v.astype(mx.float16)
                       for k, v in weights.items()}
        model.load_weights([(k, v.astype(mx.float32)) for k, v in weights.items()], strict=True)
        mx.eval(model.parameters())
        return model


def requantized(w: mx.array, bits: int, group_size: int = 32) -> mx.array:
    """`w` in float16 through MLX's affine quantization and back (float16)."""
    parts = mx.quantize(w.astype(mx.float16), group_size=group_size, bits=bits)
    return mx.dequantize(*parts, group_size=group_size, bits=bits)


def write_gguf(path: Path, arch: str, qtype: Q = Q.F32, *, seed: int = 0,
               types: dict[str, Q] | None = None, file_type: LlamaFileType | None = None,
               architecture: str | None = None, rope_scaling: dict | None = None) -> TinyGGUF:
    """Write a tiny `arch` model as a GGUF with every matrix in `qtype`.

    Args:
        path: The file to write.
        arch: One of `ARCHITECTURES`.
        qtype: The GGML type of every 2-D tensor (1-D tensors are F32, as llama.cpp keeps them).
        seed: Seeds the weights (and the random K-quant blocks).
        types: Per GGUF tensor name, a type overriding `qtype` (a mix such as Q4_K_M).
        file_type: `general.file_type`; by default the one that names `qtype`.
        architecture: Written as `general.architecture` (and the `{arch}.*` key prefix) instead
            of `arch`: a file of an architecture codectx does not know.
        rope_scaling: `LLAMA32_ROPE` (llama) or `GEMMA3_ROPE` (gemma3), written as llama.cpp
            writes it and set in the reference's config.
    """
    vocab = sentencepiece_vocab() if arch == "gemma3" else bpe_vocab(
        "llama-bpe" if arch == "llama" else "qwen2", add_bos=arch == "llama")
    config = hf_config(arch, len(vocab.tokens))
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    rng = np.random.default_rng(seed + 1)
    writer = GGUFWriter(str(path), architecture or arch)
    _write_metadata(writer, arch, config, file_type if file_type is not None else FILE_TYPES[qtype])
    vocab.write(writer)
    held: dict[str, np.ndarray] = {}
    written: dict[str, Q] = {}
    for hf_name, w in hf_weights(arch, config, seed).items():
        name = gguf_name(arch, hf_name)
        kind = Q.F32 if w.ndim == 1 else (types or {}).get(name, qtype)
        data, values = encode(to_gguf_layout(arch, hf_name, w), kind, rng)
        writer.add_tensor(name, data, raw_dtype=None if kind in (Q.F32, Q.F16) else kind)
        if values is not None:
            held[hf_name] = from_gguf_layout(arch, hf_name, values)
        written[name] = kind
    if config.get("rope_scaling", {}).get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
        written["rope_freqs.weight"] = Q.F32
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyGGUF(path=Path(path), arch=arch, config=config, weights=held, types=written, vocab=vocab)


def _write_metadata(writer: GGUFWriter, arch: str, config: dict, file_type: LlamaFileType) -> None:
    """The `general.*` and `{arch}.*` keys llama.cpp's converter writes for these models."""
    writer.add_name(f"tiny-{arch}")
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(2)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if arch == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    if arch == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
    if config.get("rope_scaling", {}).get("rope_type") == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(config["rope_scaling"]["factor"])


def llama3_rope_factors(config: dict) -> np.ndarray:
    """Llama 3's per-frequency RoPE divisors as llama.cpp's converter computes them: 1 for short
    wavelengths, the factor for long ones, a smooth blend between."""
    scaling = config["rope_scaling"]
    dim = config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    wavelengths = 2 * np.pi / freqs
    original, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    smooth = (original / wavelengths - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelengths < original / high, 1.0,
                    np.where(wavelengths > original / low, factor, blended)).astype(np.float32)


def q4_k_m_types(layers: int) -> dict[str, Q]:
    """A Q4_K_M-style mix (the matrices Q4_K, each layer's attn_v and ffn_down Q6_K), as overrides
    for `write_gguf(..., Q.Q4_K, types=..., file_type=LlamaFileType.MOSTLY_Q4_K_M)`."""
    return {f"blk.{i}.{name}.weight": Q.Q6_K for i in range(layers) for name in ("attn_v", "ffn_down")}
