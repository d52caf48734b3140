"""Fixtures for context tests: tokenizers trained offline, a fixture repo, an isolated cache."""
from __future__ import annotations

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from context.hf_tokenizer import HFTokenizer
import chat_templates
import fixture_repo

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _corpus() -> list[str]:
    texts = list(fixture_repo.FILES.values())
    texts += ["def main():\n    return 1\n\n\n" * 3, "    \n\n  \t\n", "<file path=\"a\">\n</file>\n"]
    return texts * 4


def _train(pre_tokenizer, vocab: int = 1200) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    return tok


@pytest.fixture(scope="session")
def smol_tokenizer() -> HFTokenizer:
    """SmolLM2-style: individual digits + ByteLevel (GPT-2 regex), SmolLM2's chat template."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return HFTokenizer(_train(pre), chat_templates.SMOLLM2)


@pytest.fixture(scope="session")
def qwen_tokenizer() -> HFTokenizer:
    """Qwen2-style: Qwen's split regex + ByteLevel without regex, a Qwen2.5-style template."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return HFTokenizer(_train(pre), chat_templates.QWEN25)


@pytest.fixture(autouse=True)
def codectx_home(tmp_path_factory, monkeypatch):
    """Every test gets its own cache root."""
    home = tmp_path_factory.mktemp("codectx-home")
    monkeypatch.setenv("CODECTX_HOME", str(home))
    return home


@pytest.fixture
def repo(tmp_path):
    """The fixture repository (not a git work tree)."""
    return fixture_repo.write(tmp_path / "demo")
