"""GGUF tokenizers rebuilt from metadata (engine/gguf_tokenizer.py), checked against llama.cpp.

Tiny real vocabularies are trained here (a byte-level BPE with `tokenizers`, SentencePiece BPE
models with `sentencepiece`) and written into GGUF files by the `gguf` package, with zero
weights so that llama.cpp's `llama-server` loads them. Every vocabulary kind must encode a
corpus of code, prose, unicode, digits, whitespace runs and special tokens exactly as
llama.cpp's own tokenizer does; SentencePiece vocabularies also as the `sentencepiece` library
does, and byte-level ones as transformers' GGUF converter does.
"""
from __future__ import annotations

import io
import json
from functools import cache
from pathlib import Path

import httpx
import mlx.core as mx
import numpy as np
import pytest
import sentencepiece as spm
from gguf import GGUFWriter
from mlx_lm.tokenizer_utils import load as load_tokenizer_dir
from tiny_models import CHAT_TEMPLATE, corpus
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, pre_tokenizers, trainers

from engine.default_model import GGUF_NAME
from engine.errors import ModelLoadError
from engine.gguf_read import open_gguf
from engine.gguf_tokenizer import eos_token_ids, gguf_tokenizer, tokenizer_config
from engine.tokenizer import Tokenizer
from tests.server.remote_servers import start_llama_server

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
BPE_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
UNREACHABLE = "Ġzyxwv"  # in the vocabulary, but no merge builds it
TURNS = ("<start_of_turn>", "<end_of_turn>")
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + m['role'] + '\n' + m['content']"
                  " + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
                  "{{ '<start_of_turn>model\n' }}{% endif %}")
PLAIN = [
    "def greet(name: str) -> str:\n    return f\"Hello, {name}!\"  # 42\n\n\n\tpass\r\n",
    "I'm sure you'RE right, they'll say; it's 2024-12-04 at 10:45.",
    "Grüße aus Köln — naïve café; 東京 と 大阪; Ελληνικά; emoji 🙂🚀🦙 e\u0301 \u200b\ufeff",
    "x = 1234567 + 89.001e-10; y = 3.14159; ١٢٣ ½",
    "   leading, trailing   ",
    "a  b   c    d\n\n\n\t\t  end",
    " zyxwv zyxwvzyxwv",
    "",
]
WITH_SPECIAL = {
    "bpe": ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>hmm</think>ok<|endoftext|>"],
    "spm": ["<start_of_turn>user\n    hi  there<end_of_turn>\n<start_of_turn>model\n"],
}
BPE_KINDS = ("gpt-2", "default", "smollm", "qwen2", "llama-bpe")
SPM_KINDS = ("spm-llama", "spm-gemma")


@cache
def trained_bpe() -> RawTokenizer:
    """A GPT-2-style byte-level BPE whose merges include digit runs."""
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=list(BPE_SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    numbers = [f"{n}{n * 7}{n * 1237} {n}" for n in range(0, 3000, 3)]
    tok.train_from_iterator([*corpus().splitlines(keepends=True), *numbers, *PLAIN], trainer=trainer)
    return tok


def bpe_metadata(pre: str) -> dict:
    """The trained BPE as GGUF metadata, plus a user-defined `<think>` pair and UNREACHABLE."""
    tok = trained_bpe()
    ids = tok.get_vocab()
    tokens = [*sorted(ids, key=ids.get), "<think>", "</think>", UNREACHABLE]
    types = [CONTROL if t in BPE_SPECIAL else USER_DEFINED if "think>" in t else NORMAL for t in tokens]
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]],
        "tokenizer.ggml.bos_token_id": ids["<|endoftext|>"], "tokenizer.ggml.eos_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.eot_token_id": ids["<|im_end|>"], "tokenizer.ggml.padding_token_id": ids["<|endoftext|>"],
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


@cache
def trained_spm(space_prefix: bool) -> spm.SentencePieceProcessor:
    """A SentencePiece BPE model with byte fallback (Llama 2's layout: <unk> 0, <s> 1, </s> 2)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([*corpus().splitlines(), *PLAIN]), model_writer=model, vocab_size=500,
        model_type="bpe", byte_fallback=True, control_symbols=list(TURNS), add_dummy_prefix=space_prefix,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        split_digits=True, character_coverage=0.99, num_threads=1, minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def spm_metadata(kind: str) -> dict:
    """`spm-llama` as Llama 2's GGUFs (flags left to their defaults); `spm-gemma` as Gemma 3's: no
    space prefix, end of turn named, whitespace runs user-defined and spelled with real spaces.

    The learned pieces are listed in reverse (`spm_ids` maps the model's ids to these), so that
    an id's place says nothing of its merge order: only the scores do.
    """
    gemma = kind == "spm-gemma"
    sp = trained_spm(space_prefix=not gemma)
    tokens, types, scores = [], [], []
    for i in spm_order(gemma):
        piece = sp.id_to_piece(i)
        kind_ = (UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else BYTE if sp.is_byte(i)
                 else NORMAL)
        if gemma and len(piece) > 1 and set(piece) == {"▁"}:
            piece, kind_ = " " * len(piece), USER_DEFINED
        tokens.append(piece)
        types.append(kind_)
        scores.append(sp.get_score(i))
    meta = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    }
    if gemma:
        meta.update({"tokenizer.ggml.add_space_prefix": False, "tokenizer.ggml.add_bos_token": True,
                     "tokenizer.ggml.eot_token_id": tokens.index("<end_of_turn>"),
                     "tokenizer.chat_template": GEMMA_TEMPLATE})
    return meta


def spm_order(gemma: bool) -> list[int]:
    """The SentencePiece model's ids in GGUF order: special and byte pieces first, learned ones reversed."""
    sp = trained_spm(space_prefix=not gemma)
    first = [i for i in range(sp.get_piece_size()) if sp.is_unknown(i) or sp.is_control(i) or sp.is_byte(i)]
    return first + [i for i in reversed(range(sp.get_piece_size())) if i not in set(first)]


def spm_ids(gemma: bool, ids: list[int]) -> list[int]:
    position = {sp_id: index for index, sp_id in enumerate(spm_order(gemma))}
    return [position[i] for i in ids]


_WRITERS = {
    "tokenizer.ggml.model": "add_tokenizer_model", "tokenizer.ggml.pre": "add_tokenizer_pre",
    "tokenizer.ggml.tokens": "add_token_list", "tokenizer.ggml.token_type": "add_token_types",
    "tokenizer.ggml.merges": "add_token_merges", "tokenizer.ggml.scores": "add_token_scores",
    "tokenizer.ggml.bos_token_id": "add_bos_token_id", "tokenizer.ggml.eos_token_id": "add_eos_token_id",
    "tokenizer.ggml.eot_token_id": "add_eot_token_id", "tokenizer.ggml.unknown_token_id": "add_unk_token_id",
    "tokenizer.ggml.padding_token_id": "add_pad_token_id", "tokenizer.ggml.add_bos_token": "add_add_bos_token",
    "tokenizer.ggml.add_space_prefix": "add_add_space_prefix", "tokenizer.chat_template": "add_chat_template",
}


def write_gguf(path: Path, metadata: dict, dim: int = 32) -> Path:
    """A one-layer llama GGUF with zero weights around `metadata`'s tokenizer."""
    writer = GGUFWriter(str(path), "llama")
    for name, value in (("context_length", 512), ("embedding_length", dim), ("block_count", 1),
                        ("feed_forward_length", dim), ("head_count", 1), ("head_count_kv", 1)):
        getattr(writer, f"add_{name}")(value)
    writer.add_layer_norm_rms_eps(1e-5)
    for key, value in metadata.items():
        getattr(writer, _WRITERS[key])(value)
    zeros = lambda *shape: np.zeros(shape, dtype=np.float32)  # noqa: E731
    writer.add_tensor("token_embd.weight", zeros(len(metadata["tokenizer.ggml.tokens"]), dim))
    writer.add_tensor("output_norm.weight", zeros(dim))
    for name in ("attn_norm", "ffn_norm"):
        writer.add_tensor(f"blk.0.{name}.weight", zeros(dim))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        writer.add_tensor(f"blk.0.{name}.weight", zeros(dim, dim))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class LlamaCpp:
    """llama.cpp's tokenizer: `llama-server` on a GGUF, asked over loopback HTTP."""

    def __init__(self, gguf: Path) -> None:
        self.process, url = start_llama_server(gguf, context=512)
        self.http = httpx.Client(base_url=url.removesuffix("/v1"), timeout=30)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": True}
        return self.http.post("/tokenize", json=body).json()["tokens"]

    def close(self) -> None:
        self.http.close()
        self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """kind -> (metadata as the engine reads it back from the kind's GGUF, llama.cpp on that GGUF);
    each server starts on first use."""
    started: dict[str, tuple[dict, LlamaCpp]] = {}

    def get(kind: str) -> tuple[dict, LlamaCpp]:
        if kind not in started:
            meta = spm_metadata(kind) if kind.startswith("spm") else bpe_metadata(kind)
            path = write_gguf(tmp_path_factory.mktemp("vocab") / f"{kind}.gguf", meta)
            started[kind] = (open_gguf(path).metadata, LlamaCpp(path))
        return started[kind]

    yield get
    for _, server in started.values():
        server.close()


@pytest.mark.parametrize("kind", BPE_KINDS + SPM_KINDS)
def test_encodes_and_decodes_as_llama_cpp(vocab, kind):
    meta, llama_cpp = vocab(kind)
    hf = gguf_tokenizer(meta)
    for text in PLAIN + WITH_SPECIAL["spm" if kind.startswith("spm") else "bpe"]:
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == llama_cpp.encode(text), text
        assert hf.encode(text) == llama_cpp.encode(text, add_special=True), text
    for text in PLAIN:
        assert hf.decode(hf.encode(text, add_special_tokens=False)) == text
    assert len(hf) == len(meta["tokenizer.ggml.tokens"])  # every special token was already in the vocabulary


@pytest.mark.parametrize("kind", SPM_KINDS)
def test_sentencepiece_vocabulary_encodes_as_sentencepiece(vocab, kind):
    meta, _ = vocab(kind)
    hf = gguf_tokenizer(meta)
    gemma = kind == "spm-gemma"
    sp = trained_spm(space_prefix=not gemma)
    for text in PLAIN:
        assert hf.encode(text, add_special_tokens=False) == spm_ids(gemma, sp.encode(text)), text
    ids = hf.encode("🦙", add_special_tokens=False)  # not in the vocabulary: one byte token per byte
    assert hf.convert_ids_to_tokens(ids)[-4:] == [f"<0x{b:02X}>" for b in "🦙".encode()]
    assert hf.decode(ids[-1:]) == "\ufffd"  # a stray byte decodes, it does not raise
    assert hf.decode(ids[-4:]) == "🦙"


@pytest.mark.parametrize("kind", ["qwen2", "gpt-2"])
def test_byte_level_vocabulary_encodes_as_transformers_converter(vocab, kind):
    # transformers' converter agrees with llama.cpp on these two; it has no `ignore_merges` for
    # llama-bpe and no space prefix before leading spaces for SentencePiece.
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    meta, _ = vocab(kind)
    fields = {"tokenizer_type": "model", "pre_tokenizer_type": "pre", "tokens": "tokens",
              "token_type": "token_type", "merges": "merges"}
    reference, _ = convert_gguf_tokenizer("qwen2", {k: meta[f"tokenizer.ggml.{v}"] for k, v in fields.items()})
    hf = gguf_tokenizer(meta)
    for text in PLAIN + WITH_SPECIAL["bpe"]:
        assert hf.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(("kind", "pieces"), [
    ("qwen2", ["x", "=", "1", "2", "3", "4", "5", "6", "7"]),
    ("smollm", ["x", "=", "1", "2", "3", "4", "5", "6", "7"]),
    ("llama-bpe", ["x", "=", "123", "456", "7"]),
    ("gpt-2", ["x", "=", "1234567"]),
])
def test_pre_tokenizer_splits_digits_as_the_model_was_trained(vocab, kind, pieces):
    hf = gguf_tokenizer(vocab(kind)[0])
    split = hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x=1234567")
    assert [piece for piece, _ in split] == pieces


def test_llama3_keeps_a_word_that_is_a_token_whole(vocab):
    unreachable = vocab("llama-bpe")[0]["tokenizer.ggml.tokens"].index(UNREACHABLE)
    assert gguf_tokenizer(vocab("llama-bpe")[0]).encode(" zyxwv", add_special_tokens=False) == [unreachable]
    assert len(gguf_tokenizer(vocab("qwen2")[0]).encode(" zyxwv", add_special_tokens=False)) > 1


@pytest.mark.parametrize(("kind", "specials"), [
    ("qwen2", ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"]),
    ("spm-gemma", ["<start_of_turn>", "<end_of_turn>", "<s>", "</s>", "    ", "  "]),
])
def test_special_and_user_defined_tokens_encode_as_one_id(vocab, kind, specials):
    meta, _ = vocab(kind)
    hf = gguf_tokenizer(meta)
    for special in specials:
        assert hf.encode(special, add_special_tokens=False) == [meta["tokenizer.ggml.tokens"].index(special)]
        assert hf.decode(hf.encode(special, add_special_tokens=False)) == special


def test_a_stray_byte_of_a_byte_level_vocabulary_decodes(vocab):
    hf = gguf_tokenizer(vocab("qwen2")[0])
    ids = hf.encode("🦙", add_special_tokens=False)
    assert len(ids) > 1 and hf.decode(ids) == "🦙"
    assert "\ufffd" in hf.decode(ids[:1])


def test_end_of_turn_tokens_stop_even_when_the_metadata_names_none(vocab):
    meta = {k: v for k, v in vocab("qwen2")[0].items() if k != "tokenizer.ggml.eot_token_id"}
    tokens = meta["tokenizer.ggml.tokens"]
    assert eos_token_ids(meta) == sorted([tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")])
    meta = {**meta, "tokenizer.ggml.eos_token_id": tokens.index("<|im_start|>")}
    assert tokens.index("<|im_start|>") in eos_token_ids(meta)


@pytest.mark.parametrize(("kind", "ends"), [
    ("qwen2", ["<|endoftext|>", "<|im_end|>"]),
    ("spm-gemma", ["</s>", "<end_of_turn>"]),
])
def test_chat_template_and_stop_tokens_come_from_the_metadata(vocab, kind, ends):
    meta, _ = vocab(kind)
    tokens = meta["tokenizer.ggml.tokens"]
    stops = eos_token_ids(meta)
    assert stops == sorted(tokens.index(t) for t in ends)
    tokenizer = Tokenizer.from_hf(gguf_tokenizer(meta), stops)
    prompt = tokenizer.render_chat([{"role": "user", "content": "hi"}])
    turn = "<|im_start|>" if kind == "qwen2" else "<start_of_turn>"
    assert prompt.endswith(f"{turn}assistant\n" if kind == "qwen2" else f"{turn}model\n")
    ids = tokenizer.encode(prompt)
    assert tokens.index(turn) in ids and tokenizer.decode(ids) == prompt
    assert tokenizer.eos_token_ids == set(stops)


@pytest.mark.parametrize(("kind", "flags", "first", "last"), [
    ("qwen2", {}, None, None),
    ("llama-bpe", {}, "<|endoftext|>", None),  # llama.cpp's default for Llama 3 vocabularies
    ("spm-llama", {}, "<s>", None),  # and for SentencePiece ones
    ("spm-llama", {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True}, None, "</s>"),
])
def test_bos_and_eos_flags(vocab, kind, flags, first, last):
    meta = {**vocab(kind)[0], **flags}
    hf = gguf_tokenizer(meta)
    bare, full = hf.encode("hi", add_special_tokens=False), hf.encode("hi")
    assert full == ([hf.convert_tokens_to_ids(first)] if first else []) + bare + (
        [hf.convert_tokens_to_ids(last)] if last else [])


@pytest.mark.parametrize("kind", ["qwen2", "spm-gemma"])
def test_saved_tokenizer_loads_back_the_same(vocab, kind, tmp_path):
    meta, _ = vocab(kind)
    hf = gguf_tokenizer(meta)
    hf.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(hf, meta)))
    loaded = Tokenizer(load_tokenizer_dir(tmp_path, eos_token_ids=eos_token_ids(meta)))
    direct = Tokenizer.from_hf(hf, eos_token_ids(meta))
    assert loaded.fingerprint == direct.fingerprint
    text = WITH_SPECIAL["bpe" if kind == "qwen2" else "spm"][0] + PLAIN[2]
    assert loaded.hf.encode(text) == hf.encode(text)


def test_metadata_arrays_may_be_numpy_or_mlx(vocab):
    meta = vocab("spm-gemma")[0]
    arrays = {**meta, "tokenizer.ggml.token_type": np.array(meta["tokenizer.ggml.token_type"], dtype=np.int32),
              "tokenizer.ggml.scores": mx.array(meta["tokenizer.ggml.scores"]),
              "tokenizer.ggml.eot_token_id": mx.array(meta["tokenizer.ggml.eot_token_id"])}
    assert gguf_tokenizer(arrays).backend_tokenizer.to_str() == gguf_tokenizer(meta).backend_tokenizer.to_str()
    assert eos_token_ids(arrays) == eos_token_ids(meta)


@pytest.mark.parametrize(("change", "message"), [
    ({"tokenizer.ggml.model": "bert"}, "tokenizer model 'bert'"),
    ({"tokenizer.ggml.pre": "tekken"}, "pre-tokenizer 'tekken'"),
    ({"tokenizer.ggml.tokens": None}, "lacks 'tokenizer.ggml.tokens'"),
    ({"tokenizer.ggml.merges": ["Ġ"]}, "malformed GGUF merge"),
    ({"tokenizer.ggml.merges": ["Ġ nonexistent"]}, "merges do not fit"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "2 token types"),
    ({"tokenizer.ggml.eos_token_id": 10**6}, "outside the vocabulary"),
])
def test_unsupported_or_malformed_vocabulary_is_a_clear_error(vocab, change, message):
    meta = {**vocab("qwen2")[0], **change}
    meta = {key: value for key, value in meta.items() if value is not None}
    with pytest.raises(ModelLoadError, match=message):
        gguf_tokenizer(meta)
    assert gguf_tokenizer(vocab("qwen2")[0]).encode("ok", add_special_tokens=False)  # nothing was left broken


@pytest.mark.default_model
def test_default_gguf_vocabulary_encodes_as_llama_cpp(default_model_path, tmp_path):
    meta = open_gguf(default_model_path / GGUF_NAME).metadata
    assert meta["tokenizer.ggml.pre"] == "smollm"
    hf = gguf_tokenizer(meta)
    # its vocabulary in a zero-weight GGUF: llama.cpp starts on that in a fraction of the time
    vocabulary = write_gguf(tmp_path / "smollm.gguf", {k: v for k, v in meta.items() if k in _WRITERS})
    llama_cpp = LlamaCpp(vocabulary)
    try:
        for text in PLAIN + WITH_SPECIAL["bpe"] + [corpus()[:4000]]:
            assert hf.encode(text, add_special_tokens=False) == llama_cpp.encode(text), text[:80]
            assert hf.encode(text) == llama_cpp.encode(text, add_special=True), text[:80]
    finally:
        llama_cpp.close()
    assert eos_token_ids(meta) == [hf.convert_tokens_to_ids("<|endoftext|>"), hf.convert_tokens_to_ids("<|im_end|>")]
