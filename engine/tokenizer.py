"""The engine's tokenizer: one small interface over a Hugging Face fast tokenizer.

`Tokenizer` never adds BOS/EOS or other special tokens on its own: the chat
template decides where they go, so that tokenizing prompt segments one by one
gives the same ids as tokenizing the rendered template (docs/context.md).
"""
from __future__ import annotations

import json
from functools import cached_property
from typing import Any, Callable, Iterable, Sequence

import xxhash
from tokenizers import decoders
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
    StreamingDetokenizer,
    TokenizerWrapper,
)

from .loop_guard import LoopKeys

# Bump when the fingerprint's input changes shape, so old caches miss cleanly.
_FINGERPRINT_VERSION = 1


class Detokenizer:
    """Turns a stream of token ids into text deltas that never split a UTF-8 character.

    Byte-level BPE streams drop the space that begins the very first token (a
    reply's first word), as mlx-lm does, unless the generation continues an answer
    already started in the prompt (`continuation`: a hover's "`name` is" is followed
    by " a function", not "a function"); otherwise the deltas join to `decode`.

    Example:
        stream = tokenizer.detokenizer()
        for token in tokens:
            print(stream.add(token), end="")
        print(stream.finalize())
    """

    def __init__(self, streaming: StreamingDetokenizer, decode: Callable[[list[int]], str] | None = None) -> None:
        self._streaming = streaming
        self._decode = decode  # set for a continuation: puts back a first space the stream trimmed
        self._lead = ""

    def add(self, token_id: int) -> str:
        """Consume one token; return the text it completes (possibly "")."""
        self._streaming.add_token(int(token_id))
        return self._restore_space(self._streaming.last_segment)

    def finalize(self) -> str:
        """Flush text held back for an incomplete character or word; return it."""
        self._streaming.finalize()
        return self._restore_space(self._streaming.last_segment)

    def _restore_space(self, segment: str) -> str:
        if self._decode is None or not segment:
            return segment
        decode, self._decode = self._decode, None  # only the first text can have lost it
        if decode(list(self._streaming.tokens)).startswith(" ") and not segment.startswith(" "):
            self._lead = " "
            return " " + segment
        return segment

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return self._lead + self._streaming.text

    @property
    def tokens(self) -> list[int]:
        """All token ids added so far."""
        return list(self._streaming.tokens)


class Tokenizer:
    """Encode, decode, stream-decode and chat-render for one model.

    Built from mlx-lm's `TokenizerWrapper` (what its loader returns) or from a
    `transformers.PreTrainedTokenizerFast`. `wrapper` (mlx-lm) and `hf`
    (transformers) stay available for library functions that expect them.

    Args:
        tokenizer: A `TokenizerWrapper` or a Hugging Face fast tokenizer.
        eos_token_ids: Extra ids that end generation, besides the tokenizer's
            eos (only used when `tokenizer` is not already a `TokenizerWrapper`).
    """

    def __init__(self, tokenizer: TokenizerWrapper | Any, eos_token_ids: Iterable[int] = ()) -> None:
        if not isinstance(tokenizer, TokenizerWrapper):
            tokenizer = TokenizerWrapper(
                tokenizer, _detokenizer_class(tokenizer), eos_token_ids=list(eos_token_ids)
            )
        self.wrapper = tokenizer
        self.hf = tokenizer._tokenizer  # noqa: SLF001 - mlx-lm exposes no public accessor

    @classmethod
    def from_hf(cls, hf_tokenizer: Any, eos_token_ids: Iterable[int] = ()) -> Tokenizer:
        """Wrap a Hugging Face fast tokenizer (same as ``Tokenizer(hf_tokenizer, eos_token_ids)``)."""
        return cls(hf_tokenizer, eos_token_ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without BOS/EOS (special-token strings in it are parsed). Any length:
        whole files are counted on purpose, and a prompt's fit in the model's context is checked where
        it is built (`server.core.context_fit`), so transformers' warning past its `model_max_length`
        (which an editor shows as an error line) is not asked for."""
        return list(self.hf.encode(text, add_special_tokens=False, verbose=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens included."""
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def detokenizer(self, continuation: bool = False) -> Detokenizer:
        """A fresh streaming detokenizer (one per generation); `continuation` when the prompt
        ends inside the answer, so its first token's space is kept."""
        return Detokenizer(self.wrapper.detokenizer, self.decode if continuation else None)

    @cached_property
    def loop_keys(self) -> LoopKeys:
        """What the loop guard compares for this tokenizer's tokens (`engine.loop_guard.LoopKeys`)."""
        return LoopKeys(self.decode)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end a generation."""
        return frozenset(self.wrapper.eos_token_ids)

    @property
    def chat_template(self) -> str | None:
        """The Jinja chat template, or None for a model without one."""
        template = self.hf.chat_template
        return template if isinstance(template, str) else None

    def get_vocab(self) -> dict[str, int]:
        """Token string -> id, added tokens included."""
        return dict(self.hf.get_vocab())

    @property
    def vocab_size(self) -> int:
        """Number of tokens the tokenizer knows, added tokens included."""
        return len(self.hf)

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """Render `messages` with the model's chat template.

        A model without a template (a base model) gets plain ``role: content``
        lines, ending with ``assistant:`` when a generation prompt is asked for.

        Args:
            messages: ``{"role": ..., "content": ...}`` dicts.
            add_generation_prompt: End with the assistant header.
            tools: Tool schemas for templates that support them.

        Returns:
            The prompt text; `encode` it to get the ids.
        """
        if self.chat_template is None:
            lines = [f"{m['role']}: {m['content']}" for m in messages]
            if add_generation_prompt:
                lines.append("assistant:")
            return "\n".join(lines)
        return self.hf.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    @cached_property
    def fingerprint(self) -> str:
        """xxh3_64 hex over everything that decides token ids and prompt text.

        Covers the vocabulary, merges, normalizer and pre-tokenizer (the backend
        tokenizer's JSON, which `tokenizers` serializes deterministically), the
        special tokens, the eos ids and the chat template. Equal across
        processes for the same tokenizer files.
        """
        rest = {
            "version": _FINGERPRINT_VERSION,
            "special_tokens": sorted(
                (str(t), self.hf.convert_tokens_to_ids(str(t)))
                for t in self.hf.all_special_tokens
            ),
            "eos_token_ids": sorted(self.eos_token_ids),
            "chat_template": self.chat_template,
        }
        digest = xxhash.xxh3_64(self.hf.backend_tokenizer.to_str().encode("utf-8"))
        digest.update(json.dumps(rest, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        return digest.hexdigest()


def _detokenizer_class(hf_tokenizer: Any) -> type[StreamingDetokenizer]:
    """The mlx-lm streaming detokenizer that fits the tokenizer's decoder."""
    if isinstance(hf_tokenizer.backend_tokenizer.decoder, decoders.ByteLevel):
        return BPEStreamingDetokenizer
    return NaiveStreamingDetokenizer
