"""Bounding a prompt's size before the work it costs: by characters without tokenizing, then by tokens.

No token of a model stands for more characters than its longest vocabulary entry, so a text of ``C``
characters has at least ``C / longest`` tokens: a text far too long to fit is refused by its size
alone, before tokenizing (which costs time in proportion to the text). The HTTP API refuses oversize
messages so (`server.http.prompt_limits`), and `codectx.ask` its question and selection.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable

from .errors import InvalidArgumentsError

SAFETY_FACTOR = 2
"""Margin over the exact bound, for normalizers that fold several characters into one."""

_longest: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_longest_lock = threading.Lock()


class PromptTooLongError(InvalidArgumentsError):
    """Text (or an answer's length) that cannot fit in the model's context."""


def longest_token_chars(tokenizer: Any) -> int:
    """Most characters one token of `tokenizer` can stand for (computed once per tokenizer).

    Byte-level vocabularies spell every byte as one character, so an entry's
    length bounds the UTF-8 bytes (hence characters) it decodes to; other
    vocabularies spell text as it is, or spell a single byte with several
    characters (``<0x0A>``), which only loosens the bound.
    """
    with _longest_lock:
        if tokenizer not in _longest:
            _longest[tokenizer] = max((len(entry) for entry in tokenizer.get_vocab()), default=1) or 1
        return _longest[tokenizer]


def check_text_fits(tokenizer: Any, texts: Iterable[str], limit: int, what: str = "the messages") -> None:
    """Refuse, without tokenizing, text that cannot fit in `limit` tokens.

    Raises:
        PromptTooLongError: The characters exceed `limit` × the longest token × `SAFETY_FACTOR`.
    """
    chars = sum(len(text) for text in texts)
    longest = longest_token_chars(tokenizer)
    if chars > limit * longest * SAFETY_FACTOR:
        raise PromptTooLongError(
            f"{what} hold {chars} characters, which cannot fit in {limit} tokens (one token of this "
            f"model covers at most {longest} characters); refused before tokenizing")
