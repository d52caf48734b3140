"""A range of code points in one document (transports convert their positions to it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A half-open code-point range [start, end) in one document."""

    start: int
    end: int
