"""One row of the disk archive's index: where a checkpoint's arrays are and how to check them.

MLX-free: the index is read and trusted (or not) before any array is loaded.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

from engine.archive_files import is_plain_key
from engine.boundaries import Boundary
from engine.request import SegmentKind


@dataclass
class ArchiveEntry:
    """One archived checkpoint: a Boundary plus where its arrays are and how to check them."""

    key: str
    token_key: str
    parent: str
    start: int
    end: int
    tokens: bytes
    kind: str  # a SegmentKind's name
    protected: bool
    size: int
    checksum: str
    last_used: float

    @classmethod
    def from_boundary(cls, b: Boundary, size: int, checksum: str) -> ArchiveEntry:
        return cls(b.key, b.token_key, b.parent, b.start, b.end, b.tokens, SegmentKind(b.kind).value,
                   b.protected, size, checksum, time.time())

    @classmethod
    def parse(cls, key: object, value: object) -> ArchiveEntry | None:
        """The entry an index row describes, or None unless every field has the written form."""
        if not is_plain_key(key) or not isinstance(value, dict) or set(value) != _ENTRY_FIELDS:
            return None
        e = cls(**value)
        sound = (e.key == key and isinstance(e.token_key, str) and isinstance(e.kind, str) and e.kind in _KIND_NAMES
                 and (e.parent == "" or is_plain_key(e.parent)) and isinstance(e.tokens, bytes)
                 and all(is_int(v) and v >= 0 for v in (e.start, e.end, e.size))
                 and e.start <= e.end and isinstance(e.protected, bool)
                 and isinstance(e.checksum, str)
                 and isinstance(e.last_used, (int, float)) and not isinstance(e.last_used, bool))
        return e if sound else None

    def boundary(self) -> Boundary:
        return Boundary(self.key, self.token_key, self.parent, self.start, self.end,
                        self.tokens, SegmentKind(self.kind), self.protected)

    def matches(self, b: Boundary) -> bool:
        """Verified on tokens and position, not only on the hash."""
        return (self.parent, self.start, self.end, self.tokens) == (b.parent, b.start, b.end, b.tokens)


_ENTRY_FIELDS = frozenset(f.name for f in fields(ArchiveEntry))
_KIND_NAMES = frozenset(k.value for k in SegmentKind)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
