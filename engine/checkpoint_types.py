"""What the checkpoint store holds and answers: a checkpoint, a restore's plan, why a restore stopped.

`engine.checkpoints.CheckpointStore` keeps and restores them; `engine.boundaries` says where they go.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import state
from engine.boundaries import Boundary


@dataclass(frozen=True)
class Miss:
    """Why a restore stopped where it did.

    kind is one of "new prefix", "diverged", "policy mismatch", "evicted",
    "corrupt archive entry"; `token` is the first differing position for "diverged".
    """

    kind: str
    token: int | None = None

    def __str__(self) -> str:
        return f"diverged at token {self.token}" if self.kind == "diverged" else self.kind


def common_prefix(a: bytes, b: bytes) -> int:
    """Tokens two boundaries' token bytes (little-endian uint32) share from their start."""
    n = min(len(a), len(b)) // 4
    x = np.frombuffer(a[:4 * n], "<u4")
    y = np.frombuffer(b[:4 * n], "<u4")
    diff = np.nonzero(x != y)[0]
    return int(diff[0]) if diff.size else n


@dataclass(eq=False)
class Checkpoint:
    """Confirmed model state at one boundary.

    Attributes:
        boundary: Where it is and what it covers.
        recurrent: Snapshot of recurrent layers (empty for attention-only models).
        kv: An owned copy of the KV for [start, end): always off the main line (a detached
            branch tail); on it None (an offset mark into the live cache), or a copy made
            between requests ahead of the line leaving it (`CheckpointStore.copy_ahead`).
        last_used: Store tick of the last restore or record.
    """

    boundary: Boundary
    recurrent: state.Arrays = field(default_factory=dict)
    kv: state.Arrays | None = None
    last_used: int = 0

    @property
    def key(self) -> str:
        return self.boundary.key

    @property
    def nbytes(self) -> int:
        """Bytes this checkpoint owns (its tail copy and its snapshot)."""
        return state.nbytes(self.recurrent) + (state.nbytes(self.kv) if self.kv else 0)

    def matches(self, b: Boundary) -> bool:
        """Verified on tokens and position, not only on the hash."""
        cb = self.boundary
        return (cb.parent, cb.start, cb.end, cb.tokens) == (b.parent, b.start, b.end, b.tokens)


@dataclass
class Plan:
    """What `CheckpointStore.restore` will do for one request."""

    path: list[Checkpoint]
    archived: list[Any]   # engine.archive_entry.ArchiveEntry, following `path`
    miss: Miss | None

    @property
    def offset(self) -> int:
        last = self.archived[-1] if self.archived else (self.path[-1].boundary if self.path else None)
        return last.end if last is not None else 0
