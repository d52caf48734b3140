"""Per-thread switches a compute path turns on around a forward, and the layers read.

The engine's compute path (`engine.compute.ComputePath`) decides once which variant of a
layer runs; the layers are the model's own modules, so the path tells them for the span
of one forward through a switch: a context variable, so the engine's worker thread and a
benchmark's thread never see each other's setting.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator


class Switch:
    """An on/off setting of the current thread (off unless inside `scope`).

    Args:
        name: The context variable's name (for debugging).
    """

    def __init__(self, name: str) -> None:
        self._var = contextvars.ContextVar(name, default=False)

    def on(self) -> bool:
        """Whether the switch is on on this thread now."""
        return self._var.get()

    @contextlib.contextmanager
    def scope(self, enabled: bool = True) -> Iterator[None]:
        """Inside this block the switch is `enabled` on this thread."""
        token = self._var.set(enabled)
        try:
            yield
        finally:
            self._var.reset(token)
