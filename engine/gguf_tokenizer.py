"""The tokenizer a GGUF file describes in its metadata, rebuilt for `transformers`.

GGUF stores the vocabulary under `tokenizer.ggml.*`: the token strings, their
types, merges (byte-level BPE) or scores (SentencePiece), the special token ids
and the chat template. This module rebuilds the tokenizer llama.cpp runs from
them, as a `PreTrainedTokenizerFast` over the `tokenizers` library:

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE from the merges, split first
  by the pre-tokenizer `tokenizer.ggml.pre` names (`PRE_TOKENIZERS`).
- `tokenizer.ggml.model == "llama"`: SentencePiece BPE. Spaces become "▁" (one
  more in front of each run of text when `add_space_prefix`), adjacent pieces
  merge best score first, and characters outside the vocabulary fall back to
  byte tokens `<0xNN>`.

Control tokens (type 3) become special tokens and user-defined ones (type 4)
plain added tokens; both are matched whole in the text, as llama.cpp does.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as RawTokenizer
from transformers import PreTrainedTokenizerFast

from engine.errors import ModelLoadError

# llama.cpp's token types (LLAMA_TOKEN_TYPE_*).
_UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 2, 3, 4, 6
_SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Split patterns, as llama.cpp applies them (each splits the pieces of the
# one before; matches and the text between them both become pieces).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")



class _Pre(NamedTuple):
    splits: tuple[str, ...]
    ignore_merges: bool = False  # a word that is a token stays whole
    add_bos: bool = False  # llama.cpp's default when the GGUF does not say


_GPT2_PRE = _Pre((_GPT2,))
_SMOLLM_PRE = _Pre((r"\p{N}", _GPT2))
_LLAMA3_PRE = _Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PRE = _Pre((_QWEN2,))
PRE_TOKENIZERS: dict[str, _Pre] = {
    "default": _Pre(_DEFAULT),
    "gpt-2": _GPT2_PRE, "gpt2": _GPT2_PRE, "mpt": _GPT2_PRE, "olmo": _GPT2_PRE, "phi-2": _GPT2_PRE,
    "llama-bpe": _LLAMA3_PRE, "llama3": _LLAMA3_PRE, "llama-v3": _LLAMA3_PRE, "falcon3": _LLAMA3_PRE,
    "qwen2": _QWEN2_PRE, "deepseek-r1-qwen": _QWEN2_PRE, "stablelm2": _QWEN2_PRE, "megrez": _QWEN2_PRE,
    "qwen35": _Pre((_QWEN35,)),
    "smollm": _SMOLLM_PRE, "starcoder": _SMOLLM_PRE, "refact": _SMOLLM_PRE, "codeshell": _SMOLLM_PRE,
}
"""`tokenizer.ggml.pre` values of byte-level BPE vocabularies this module rebuilds."""

# Token texts that end a turn in the chat templates of common families; llama.cpp stops on them too.
_END_OF_TURN = frozenset({
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
    "<end_of_turn>", "<EOT>",
})


def gguf_tokenizer(metadata: dict[str, Any]) -> PreTrainedTokenizerFast:
    """Rebuild the tokenizer a GGUF's metadata describes.

    Args:
        metadata: The GGUF's key-value metadata; arrays may be lists, NumPy or MLX arrays.

    Returns:
        A fast tokenizer with the GGUF's special tokens, chat template and
        BOS/EOS post-processing (`add_special_tokens=True` adds what
        `tokenizer.ggml.add_bos_token`/`add_eos_token` ask for).

    Raises:
        ModelLoadError: The tokenizer model or pre-tokenizer is not supported, or the
            vocabulary is malformed.
    """
    kind = metadata.get("tokenizer.ggml.model")
    tokens = _strings(metadata, "tokenizer.ggml.tokens")
    types = _token_types(metadata, len(tokens))
    if kind == "gpt2":
        raw = _byte_level_bpe(metadata, tokens)
    elif kind == "llama":
        raw = _sentencepiece_bpe(metadata, tokens, types)
    else:
        raise ModelLoadError(f"unsupported GGUF tokenizer model {kind!r} (supported: 'gpt2', 'llama')")
    special = [tokens[i] for i, t in enumerate(types) if t in (_CONTROL, _UNKNOWN)]
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    raw.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if t == _USER_DEFINED])
    named = {key: _special_token(metadata, tokens, key) for key in ("bos", "eos", "unknown", "padding")}
    raw.post_processor = _post_processor(metadata, tokens)
    arch = metadata.get("general.architecture")
    return PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=named["bos"],
        eos_token=named["eos"],
        unk_token=named["unknown"],
        pad_token=named["padding"],
        additional_special_tokens=special,
        chat_template=metadata.get("tokenizer.chat_template"),
        model_max_length=int(metadata.get(f"{arch}.context_length", 0)) or None,
        clean_up_tokenization_spaces=False,
    )


def eos_token_ids(metadata: dict[str, Any]) -> list[int]:
    """Ids that end a generation: the GGUF's eos, eot and eom ids, and end-of-turn tokens.

    End-of-turn tokens are the vocabulary's `<|im_end|>`, `<|endoftext|>`,
    `<|eot_id|>`, `<|eom_id|>`, `<|end_of_text|>`, `<|end|>`, `<end_of_turn>`
    and `<EOT>`, where present: a chat model ends its answer with its template's
    turn marker even when the metadata names another eos.

    Raises:
        ModelLoadError: An id in the metadata lies outside the vocabulary.
    """
    tokens = _strings(metadata, "tokenizer.ggml.tokens")
    ids = {_token_id(metadata, key, len(tokens)) for key in ("eos", "eot", "eom")}
    ids.update(i for i, token in enumerate(tokens) if token in _END_OF_TURN)
    return sorted(i for i in ids if i is not None)


def tokenizer_config(hf: PreTrainedTokenizerFast, metadata: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json for an mlx-lm directory: special tokens, chat template, BOS/EOS flags."""
    tokens = _strings(metadata, "tokenizer.ggml.tokens")
    types = _token_types(metadata, len(tokens))
    add_bos, add_eos = _add_bos_eos(metadata)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": hf.bos_token,
        "eos_token": hf.eos_token,
        "unk_token": hf.unk_token,
        "pad_token": hf.pad_token,
        "additional_special_tokens": [tokens[i] for i, t in enumerate(types) if t in (_CONTROL, _UNKNOWN)],
        "chat_template": hf.chat_template,
        "model_max_length": hf.model_max_length,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
    }


def _byte_level_bpe(metadata: dict[str, Any], tokens: list[str]) -> RawTokenizer:
    pre = metadata.get("tokenizer.ggml.pre") or "default"
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(
            f"unsupported GGUF pre-tokenizer {pre!r} (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    merges = []
    for merge in _strings(metadata, "tokenizer.ggml.merges"):
        left, space, right = merge.partition(" ")
        if not space:
            raise ModelLoadError(f"malformed GGUF merge {merge!r}")
        merges.append((left, right))
    splits = PRE_TOKENIZERS[pre].splits
    try:
        raw = RawTokenizer(models.BPE(vocab=_vocab(tokens), merges=merges,
                                      ignore_merges=PRE_TOKENIZERS[pre].ignore_merges))
    except Exception as err:  # tokenizers raises a bare Exception for a merge outside the vocabulary
        raise ModelLoadError(f"GGUF merges do not fit the vocabulary: {err}") from err
    raw.pre_tokenizer = _byte_level_splits(splits)
    raw.decoder = decoders.ByteLevel()
    return raw


def _byte_level_splits(splits: tuple[str, ...]) -> pre_tokenizers.PreTokenizer:
    """Split by each pattern in turn, then map bytes to the byte-level alphabet."""
    # The HF spellings of GPT-2's and SmolLM's splits: same pieces, and the default model's
    # tokenizer.json (and so its fingerprint) stays what it was.
    if splits == _GPT2_PRE.splits:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if splits == _SMOLLM_PRE.splits:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    steps = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in splits]
    return pre_tokenizers.Sequence([*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _sentencepiece_bpe(metadata: dict[str, Any], tokens: list[str], types: list[int]) -> RawTokenizer:
    scores = _numbers(metadata, "tokenizer.ggml.scores", len(tokens))
    vocab = _vocab(tokens)
    unk = _special_token(metadata, tokens, "unknown")
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=_merges_by_score(tokens, types, scores, vocab),
                                  unk_token=unk, fuse_unk=True, byte_fallback=True))
    # llama.cpp puts a space before each run of text between special tokens, so the
    # normalizer (which runs on each such run) does it, not a pre-tokenizer.
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(_SPACE)] if prefix else []
    raw.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE)])
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    raw.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return raw


def _merges_by_score(
    tokens: list[str], types: list[int], scores: list[float], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best-scored result first.

    SentencePiece (and llama.cpp) repeatedly join the adjacent pair whose join is
    the highest-scored token; BPE with these merges ranked by that score does the same.
    """
    ranked: list[tuple[float, int, str, str]] = []
    for index, token in enumerate(tokens):
        if types[index] == _BYTE or vocab.get(token) != index:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], index, left, right))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]


def _post_processor(metadata: dict[str, Any], tokens: list[str]) -> processors.PostProcessor | None:
    add_bos, add_eos = _add_bos_eos(metadata)
    ends = [(name, _token_id(metadata, name, len(tokens))) for name, wanted in (("bos", add_bos), ("eos", add_eos))
            if wanted]
    ends = [(name, i) for name, i in ends if i is not None]
    if not ends:
        return None
    bos = [f"{tokens[i]}:0" for name, i in ends if name == "bos"]
    eos = [f"{tokens[i]}:0" for name, i in ends if name == "eos"]
    return processors.TemplateProcessing(
        single=" ".join([*bos, "$A:0", *eos]),
        pair=" ".join([*bos, "$A:0", *eos, *bos, "$B:1", *eos]),
        special_tokens=sorted({(tokens[i], i) for _, i in ends}),
    )


def _add_bos_eos(metadata: dict[str, Any]) -> tuple[bool, bool]:
    """llama.cpp's defaults: SentencePiece and Llama 3 vocabularies add BOS unless told not to."""
    if metadata.get("tokenizer.ggml.model") == "llama":
        default = True
    else:
        pre = PRE_TOKENIZERS.get(metadata.get("tokenizer.ggml.pre") or "default")
        default = pre is not None and pre.add_bos
    return (bool(metadata.get("tokenizer.ggml.add_bos_token", default)),
            bool(metadata.get("tokenizer.ggml.add_eos_token", False)))


def _special_token(metadata: dict[str, Any], tokens: list[str], key: str) -> str | None:
    index = _token_id(metadata, key, len(tokens))
    return None if index is None else tokens[index]


def _token_id(metadata: dict[str, Any], key: str, vocab_size: int) -> int | None:
    value = metadata.get(f"tokenizer.ggml.{key}_token_id")
    if value is None:
        return None
    index = int(_plain(value))
    if not 0 <= index < vocab_size:
        raise ModelLoadError(f"GGUF tokenizer.ggml.{key}_token_id {index} is outside the vocabulary of {vocab_size}")
    return index


def _vocab(tokens: list[str]) -> dict[str, int]:
    """Token -> id; a repeated token keeps its last id, as in llama.cpp."""
    return {token: index for index, token in enumerate(tokens)}


def _token_types(metadata: dict[str, Any], count: int) -> list[int]:
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        return [1] * count
    values = [int(t) for t in _plain(types)]
    if len(values) != count:
        raise ModelLoadError(f"GGUF has {len(values)} token types for {count} tokens")
    return values


def _numbers(metadata: dict[str, Any], key: str, count: int) -> list[float]:
    if key not in metadata:
        raise ModelLoadError(f"GGUF metadata lacks {key!r}")
    values = [float(v) for v in _plain(metadata[key])]
    if len(values) != count:
        raise ModelLoadError(f"GGUF has {len(values)} values in {key!r} for {count} tokens")
    return values


def _strings(metadata: dict[str, Any], key: str) -> list[str]:
    if key not in metadata:
        raise ModelLoadError(f"GGUF metadata lacks {key!r}")
    values = _plain(metadata[key])
    if isinstance(values, (str, bytes)) or not all(isinstance(v, str) for v in values):
        raise ModelLoadError(f"GGUF metadata {key!r} is not a list of strings")
    return list(values)


def _plain(value: Any) -> Any:
    """A NumPy or MLX array (or scalar) as Python values; anything else unchanged."""
    return value.tolist() if hasattr(value, "tolist") else value

