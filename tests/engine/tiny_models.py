"""Tiny random-weight models saved as real mlx-lm model directories.

`build_tiny_model(directory, model_type="llama", **sizes)` writes config.json,
model.safetensors, tokenizer.json and tokenizer_config.json, so the real
loading code runs on the result. The tokenizer is a byte-level BPE trained
offline with `tokenizers` on a fixed corpus (a few standard-library modules
plus some non-ASCII lines), and the weights come from a fixed seed: the same
arguments give the same files on the same machine.

Other model types plug in through `CONFIG_BUILDERS` (model_type -> function
returning the config.json dict); the weights always come from instantiating
mlx-lm's own `Model` for that type.
"""
from __future__ import annotations

import importlib
import inspect
import json
import textwrap
from pathlib import Path
from typing import Callable

import mlx.core as mx
from mlx.utils import tree_flatten
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"

# ChatML, as in SmolLM2: simple enough for any tokenizer, real enough for the engine.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_EXTRA_TEXT = """\
Grüße aus Köln — naïve café, señor; 東京 と 大阪; Ελληνικά; emoji 🙂🚀.
def greet(name: str) -> str:
    return f"Hello, {name}!"
The quick brown fox jumps over the lazy dog. 0123456789
"""


def corpus() -> str:
    """The fixed training text: stdlib sources (deterministic per Python) plus extras."""
    import json.encoder
    import string

    sources = [inspect.getsource(m) for m in (textwrap, string, json.encoder)]
    return "\n".join(sources) + "\n" + _EXTRA_TEXT


def train_tokenizer(vocab_size: int = 512) -> Tokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style, no prefix space)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus().splitlines(keepends=True), trainer=trainer)
    return tok


def llama_config(
    *,
    vocab_size: int,
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    intermediate_size: int = 256,
    max_position_embeddings: int = 4096,
) -> dict:
    """A llama config; the default head_dim (64) matches the 8-bit KV group size."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "vocab_size": vocab_size,
        "torch_dtype": "float32",
    }


def qwen3_next_config(
    *,
    vocab_size: int,
    hidden_size: int = 64,
    num_hidden_layers: int = 4,
    full_attention_interval: int = 2,
    max_position_embeddings: int = 4096,
) -> dict:
    """A hybrid qwen3_next config: Gated DeltaNet layers (mlx-lm `ArraysCache`)
    interleaved with attention layers (`KVCache`), dense MLPs, head_dim 64."""
    return {
        "model_type": "qwen3_next",
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "intermediate_size": 2 * hidden_size,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 1,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "num_experts": 0,
        "num_experts_per_tok": 0,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 0,
        "mlp_only_layers": [],
        "moe_intermediate_size": 0,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": max_position_embeddings,
        "full_attention_interval": full_attention_interval,
        "tie_word_embeddings": True,
        "vocab_size": vocab_size,
        "torch_dtype": "float32",
    }


CONFIG_BUILDERS: dict[str, Callable[..., dict]] = {"llama": llama_config,
                                                   "qwen3_next": qwen3_next_config}


def _model_class(model_type: str):
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    return module.Model, module.ModelArgs


def build_tiny_model(
    directory: str | Path,
    model_type: str = "llama",
    *,
    seed: int = 0,
    vocab_size: int = 512,
    weight_scale: float = 2.0,
    eos_token: str | None = EOS_TOKEN,
    **sizes,
) -> Path:
    """Write a tiny random-weight model directory and return its path.

    Args:
        directory: Where to write (created if missing).
        model_type: A key of `CONFIG_BUILDERS` (an mlx-lm model module name).
        seed: Seed for the weights (the tokenizer is trained deterministically).
        vocab_size: Target vocabulary size of the trained tokenizer.
        weight_scale: Multiplies every weight; 2.0 (the default) makes greedy
            output varied instead of one repeated token.
        eos_token: The token that ends generation; None for a model that
            only stops at max_tokens (for tests that must interrupt a stream).
        **sizes: Passed to the config builder (hidden_size, num_hidden_layers, ...).

    Returns:
        The model directory.

    Raises:
        ValueError: For a model type without a config builder.
    """
    if model_type not in CONFIG_BUILDERS:
        raise ValueError(f"no tiny config builder for model_type {model_type!r}; "
                         f"known: {sorted(CONFIG_BUILDERS)}")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(vocab_size)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": eos_token,
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": list(SPECIAL_TOKENS),
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": sizes.get("max_position_embeddings", 4096),
        "clean_up_tokenization_spaces": False,
    }, indent=2))

    config = CONFIG_BUILDERS[model_type](vocab_size=tok.get_vocab_size(), **sizes)
    (path / "config.json").write_text(json.dumps(config, indent=2))

    model_cls, args_cls = _model_class(model_type)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    weights = {k: (v * weight_scale).astype(mx.float32)
               for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path
