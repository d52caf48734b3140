"""Bounding prompt work before it starts, and the threads that do it.

Tokenizing costs time in proportion to the text, so a prompt whose text is
far too long to fit is refused by its size alone (`server.core.prompt_size`).
What passes is parsed, rendered and tokenized on `Workers` (a small thread
pool), never on the event loop that answers every other request.
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar

from server.core import prompt_size
from .errors import ContextLengthError

T = TypeVar("T")


def check_text_fits(tokenizer: Any, texts: Iterable[str], limit: int) -> None:
    """Refuse, without tokenizing, text that cannot fit in `limit` tokens (`server.core.prompt_size`).

    Raises:
        ContextLengthError: The characters exceed `limit` × the longest token × `SAFETY_FACTOR`.
    """
    try:
        prompt_size.check_text_fits(tokenizer, texts, limit)
    except prompt_size.PromptTooLongError as err:
        raise ContextLengthError(str(err)) from err


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
