"""Requests counted by kind and outcome, for `codectx.status`, `/metrics` and `/monitor`.

An outcome is a finish reason (`stop`, `length`, and whatever else the engine reports, such
as `repetition`), `cancelled` or `error`: every request is counted once, however it ended.
Kinds: `ask` (one per ask, by its last round), `hover` (the model request behind a hover;
answers from the hover cache are `hoverCacheHits`), `http` (chat completions beside the
editor).
"""
from __future__ import annotations

import contextlib
import threading
from contextvars import ContextVar
from typing import Iterator

REQUEST_KIND: ContextVar[str | None] = ContextVar("codectx_request_kind", default=None)
"""The kind `Session.generate` counts its request under (None: not counted there)."""


class Outcomes:
    """Counts by (kind, outcome); safe to record from any thread (HTTP runs on its own)."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def record(self, kind: str, outcome: str) -> None:
        """Counts one request of `kind` that ended with `outcome`."""
        with self._lock:
            by_outcome = self._counts.setdefault(kind, {})
            by_outcome[outcome] = by_outcome.get(outcome, 0) + 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A copy: kind -> outcome -> count."""
        with self._lock:
            return {kind: dict(counts) for kind, counts in self._counts.items()}


@contextlib.contextmanager
def counted_as(kind: str) -> Iterator[None]:
    """Model requests made inside (and in tasks started inside) are counted as `kind`."""
    token = REQUEST_KIND.set(kind)
    try:
        yield
    finally:
        REQUEST_KIND.reset(token)
