"""What `context` needs from a tokenizer, as protocols (no MLX, no engine import).

`engine.tokenizer.Tokenizer` satisfies `TextTokenizer`; tests and the CLI can
also wrap a `tokenizers.Tokenizer` with `context.hf_tokenizer.HFTokenizer`.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable


@runtime_checkable
class TextTokenizer(Protocol):
    """Turns text into token ids.

    Attributes:
        fingerprint: Changes whenever `encode` could give different ids for the
            same text (vocabulary, merges, normalizer, pre-tokenizer, added
            tokens). Token caches are keyed by it.
        chat_template: The model's Jinja chat template, or None for none.
    """

    fingerprint: str
    chat_template: str | None

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with no special tokens added (no BOS/EOS).

        Special-token strings inside `text` map to their ids.
        """
        ...


@runtime_checkable
class BatchTextTokenizer(TextTokenizer, Protocol):
    """A `TextTokenizer` that can also encode many texts in one call (in parallel)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`[encode(t) for t in texts]`, possibly faster."""
        ...
