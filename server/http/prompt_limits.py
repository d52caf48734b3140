"""Bounding prompt work before it starts, and the threads that do it.

Tokenizing costs time in proportion to the text, so a prompt whose text is
far too long to fit is refused by its size alone: no token of the model
stands for more characters than its longest vocabulary entry, so a text of
``C`` characters has at least ``C / longest`` tokens. What passes is parsed,
rendered and tokenized on `Workers` (a small thread pool), never on the event
loop that answers every other request.
"""
from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar

from .errors import ContextLengthError

SAFETY_FACTOR = 2
"""Margin over the exact bound, for normalizers that fold several characters into one."""
T = TypeVar("T")

_longest: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_longest_lock = threading.Lock()


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


def check_text_fits(tokenizer: Any, texts: Iterable[str], limit: int) -> None:
    """Refuse, without tokenizing, text that cannot fit in `limit` tokens.

    Raises:
        ContextLengthError: The characters exceed `limit` × the longest token × `SAFETY_FACTOR`.
    """
    chars = sum(len(text) for text in texts)
    longest = longest_token_chars(tokenizer)
    if chars > limit * longest * SAFETY_FACTOR:
        raise ContextLengthError(
            f"the messages hold {chars} characters, which cannot fit in {limit} tokens (one token of this "
            f"model covers at most {longest} characters); refused before tokenizing")


class Workers:
    """A bounded pool of threads for CPU-bound request work (parsing, rendering, tokenizing).

    Args:
        threads: How many requests are worked on at once; the rest wait their turn.
    """

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="codectx-http-work")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on a worker thread; its exception is raised here."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
