"""Tiny tokenizers as GGUF metadata, in the two kinds llama.cpp's converter writes.

- `bpe_vocab`: GPT-2-style byte-level BPE (`tokenizer.ggml.model = "gpt2"`), as for Llama 3
  (pre-tokenizer `llama-bpe`) and Qwen2/Qwen3 (`qwen2`): tokens, token types, merges.
- `sentencepiece_vocab`: SentencePiece (`tokenizer.ggml.model = "llama"`), as for Gemma 3:
  tokens, scores and token types of a SentencePiece BPE model with byte fallback, trained here
  on a fixed corpus; the trained `SentencePieceProcessor` is the reference tokenizer.

Token types are llama.cpp's: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import sentencepiece as spm
from tokenizers import Regex, pre_tokenizers
from tiny_models import CHAT_TEMPLATE, SPECIAL_TOKENS, corpus, train_tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n'"
    " + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
GEMMA_TURN_TOKENS = ("<start_of_turn>", "<end_of_turn>")

# The pre-tokenizer split of each `tokenizer.ggml.pre`, as the models' own tokenizer.json has it
# (a regex Split, then byte-level mapping): Llama 3 groups digits by three, Qwen2 splits each.
_LETTERS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PRE_TOKENIZER_SPLITS = {"llama-bpe": _LETTERS + r"\p{N}{1,3}" + _REST, "qwen2": _LETTERS + r"\p{N}" + _REST}


@dataclass
class Vocab:
    """A tokenizer as GGUF `tokenizer.*` metadata plus what tests check it against.

    Attributes:
        model: `tokenizer.ggml.model` ("gpt2" or "llama").
        pre: `tokenizer.ggml.pre`.
        tokens: Every token, by id.
        token_types: llama.cpp token type per id.
        special: bos/eos/unknown/padding token ids (absent keys are not written).
        add_bos: `tokenizer.ggml.add_bos_token`.
        chat_template: `tokenizer.chat_template`.
        merges: BPE merges ("a b"), gpt2 kind only.
        scores: Piece scores, SentencePiece kind only.
        reference: Encodes text as the original tokenizer does (a `tokenizers.Tokenizer` or a
            `SentencePieceProcessor`).
    """

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    special: dict[str, int]
    add_bos: bool
    chat_template: str
    merges: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    reference: Any = None

    def encode(self, text: str) -> list[int]:
        """The reference tokenizer's ids for `text`, without bos."""
        if isinstance(self.reference, spm.SentencePieceProcessor):
            return list(self.reference.encode(text))
        return list(self.reference.encode(text).ids)

    def write(self, writer) -> None:
        """Add the tokenizer keys to a `gguf.GGUFWriter`, as llama.cpp's converter names them."""
        writer.add_tokenizer_model(self.model)
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        if self.scores:
            writer.add_token_scores(self.scores)
        writer.add_token_types(self.token_types)
        if self.merges:
            writer.add_token_merges(self.merges)
        adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
                  "unknown": writer.add_unk_token_id, "padding": writer.add_pad_token_id}
        for name, token_id in self.special.items():
            adders[name](token_id)
        writer.add_add_bos_token(self.add_bos)
        writer.add_add_eos_token(False)
        if self.model == "llama":
            writer.add_add_space_prefix(False)  # Gemma 3's converter writes this
        writer.add_chat_template(self.chat_template)


@cache  # trained once per process; callers only read it
def bpe_vocab(pre: str, *, add_bos: bool, vocab_size: int = 512) -> Vocab:
    """The tiny byte-level BPE of `tiny_models` as a GPT-2-kind GGUF vocabulary.

    Args:
        pre: The pre-tokenizer name to record, a key of `PRE_TOKENIZER_SPLITS`; the reference
            tokenizer splits text with it.
        add_bos: Whether the model expects a bos token first (Llama 3 does, Qwen does not).
        vocab_size: Target size of the trained vocabulary.
    """
    tok = train_tokenizer(vocab_size)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    ids = tok.get_vocab()
    tokens = sorted(ids, key=ids.get)
    merges = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    types = [CONTROL if t in SPECIAL_TOKENS else NORMAL for t in tokens]
    special = {"bos": ids["<|endoftext|>"], "eos": ids["<|im_end|>"], "padding": ids["<|endoftext|>"]}
    return Vocab(model="gpt2", pre=pre, tokens=tokens, token_types=types, special=special,
                 add_bos=add_bos, chat_template=CHAT_TEMPLATE, merges=merges, reference=tok)


@cache
def sentencepiece_vocab(vocab_size: int = 400) -> Vocab:
    """A SentencePiece BPE vocabulary laid out as Gemma's: <pad> 0, <eos> 1, <bos> 2, <unk> 3,
    256 byte pieces, the turn markers, then learned pieces."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus().splitlines()), model_writer=model, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        user_defined_symbols=list(GEMMA_TURN_TOKENS), add_dummy_prefix=False,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        character_coverage=1.0, num_threads=1, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    types = []
    for i, piece in enumerate(tokens):
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i) or piece in GEMMA_TURN_TOKENS:
            # the turn markers are special added tokens in Gemma's tokenizer_config: control in GGUF
            types.append(CONTROL)
        elif sp.is_byte(i):
            types.append(BYTE)
        else:
            types.append(NORMAL)
    return Vocab(
        model="llama", pre="default", tokens=tokens, token_types=types,
        special={"bos": 2, "eos": 1, "unknown": 3, "padding": 0}, add_bos=True,
        chat_template=GEMMA_CHAT_TEMPLATE, scores=[sp.get_score(i) for i in range(len(tokens))],
        reference=sp,
    )
