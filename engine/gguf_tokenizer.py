"""The tokenizer a GGUF file describes in its metadata, rebuilt for `transformers`.

GGUF stores the vocabulary, merges, token types and chat template under
`tokenizer.ggml.*`; this module turns them into a `PreTrainedTokenizerFast`
(the `tokenizers` library; transformers' own GGUF path needs torch).
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer
from transformers import PreTrainedTokenizerFast

from engine.errors import ModelLoadError

_SPECIAL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def gguf_tokenizer(metadata: dict[str, Any]) -> PreTrainedTokenizerFast:
    """Rebuild a GPT-2-style BPE tokenizer from GGUF metadata.

    Raises:
        ModelLoadError: The tokenizer model or pre-tokenizer is not supported.
    """
    kind = metadata.get("tokenizer.ggml.model")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in ("smollm", "gpt2", "default"):
        raise ModelLoadError(f"unsupported GGUF tokenizer {kind!r} with pre-tokenizer {pre!r}")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    raw = RawTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        raw.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        raw.pre_tokenizer = byte_level
    raw.decoder = decoders.ByteLevel()
    types = metadata.get("tokenizer.ggml.token_type")
    special = [] if types is None else [tokens[i] for i in _special_ids(types)]
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])

    def token(key: str) -> str | None:
        index = _optional_int(metadata.get(f"tokenizer.ggml.{key}_token_id"))
        return tokens[index] if index is not None else None

    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        additional_special_tokens=special,
        chat_template=metadata.get("tokenizer.chat_template"),
        model_max_length=int(metadata.get("llama.context_length", 0)) or None,
        clean_up_tokenization_spaces=False,
    )


def tokenizer_config(hf: PreTrainedTokenizerFast, metadata: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json for an mlx-lm directory: special tokens and the chat template."""
    tokens = metadata["tokenizer.ggml.tokens"]
    special = [tokens[i] for i in _special_ids(metadata.get("tokenizer.ggml.token_type", []))]
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": hf.bos_token,
        "eos_token": hf.eos_token,
        "unk_token": hf.unk_token,
        "pad_token": hf.pad_token,
        "additional_special_tokens": special,
        "chat_template": hf.chat_template,
        "model_max_length": hf.model_max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }


def _special_ids(types: Any) -> list[int]:
    values = types.tolist() if isinstance(types, mx.array) else list(types)
    return [i for i, t in enumerate(values) if t == _SPECIAL_TOKEN_TYPE]


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
