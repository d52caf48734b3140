"""The disk archive's index and its rows: where a checkpoint's arrays are and how to check them.

MLX-free: the index is read and trusted (or not) before any array is loaded. Processes sharing a
policy folder merge their rows into one index (`IndexFile`, under the folder's lock).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import msgpack

from engine.archive_files import is_plain_key, read_regular, stamp, write_atomically
from engine.archive_reads import INDEX_NAME, MAX_INDEX_BYTES
from engine.boundaries import Boundary
from engine.request import SegmentKind

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


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


def read_index(directory: Path, policy: str) -> dict[str, ArchiveEntry] | None:
    """The rows of `directory`'s index that have the written form, or None when there is no
    index (or it is unreadable, or another policy's or format's: logged)."""
    index = directory / INDEX_NAME
    try:
        raw = msgpack.unpackb(read_regular(index, MAX_INDEX_BYTES), raw=False)
        if raw.get("format") != FORMAT_VERSION or raw.get("policy") != policy:
            raise ValueError("foreign index")
        rows = raw["entries"].items()
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            msgpack.UnpackException) as err:
        log.warning("ignoring archive index %s: %s", index, err)
        return None
    entries, rejected = {}, []
    for key, value in rows:
        entry = ArchiveEntry.parse(key, value)
        if entry is None:
            rejected.append(key)
        else:
            entries[key] = entry
    if rejected:
        log.warning("dropping %d archive index entries that are not plain archive names "
                    "(first: %r)", len(rejected), rejected[0])
    return entries


def pack_index(policy: str, entries: dict[str, ArchiveEntry]) -> bytes:
    """The index file describing `entries` of `policy`."""
    return msgpack.packb({
        "format": FORMAT_VERSION,
        "policy": policy,
        "entries": {k: asdict(e) for k, e in entries.items()},
    }, use_bin_type=True)


class IndexFile:
    """A policy folder's index as one archive instance knows it: the keys it last read or wrote, the
    keys it removed since, and the file's `stamp` then. Used under the folder's lock (`engine.archive`)."""

    def __init__(self, directory: Path, policy: str):
        self.directory, self.policy = directory, policy
        self.path = directory / INDEX_NAME
        self.synced: set[str] = set()
        self.removed: set[str] = set()
        self.seen: tuple[int, ...] | None = None

    def changed(self) -> bool:
        """True when the file was replaced or rewritten since this instance last read or wrote it."""
        return stamp(self.path) != self.seen

    def read(self) -> dict[str, ArchiveEntry] | None:
        """`read_index`, remembering the file's stamp."""
        self.seen = stamp(self.path)
        return read_index(self.directory, self.policy)

    def merge(self, entries: dict[str, ArchiveEntry], sound: Callable[[ArchiveEntry], bool],
              fresh: str = "") -> None:
        """Bring the index on disk into `entries`: the rows other processes added or rewrote (`sound` ones),
        less those this instance removed since its last write; drop the rows the others removed. `fresh`,
        renamed into place by this instance just now, stays as it is. A missing or unreadable index
        changes nothing (this instance's rows are all that is known)."""
        disk = self.read()
        if disk is None:
            return
        for key in self.synced - disk.keys() - {fresh}:
            entries.pop(key, None)  # another process removed it, and its file
        for key, theirs in disk.items():
            ours = entries.get(key)
            if key in self.removed or key == fresh:
                continue
            if ours is not None and (ours.size, ours.checksum) == (theirs.size, theirs.checksum):
                continue  # the same file: this instance's row (its last use) stands
            if sound(theirs):  # new here, or another process wrote its file since
                entries[key] = theirs
            else:
                entries.pop(key, None)
        self.synced = set(disk)

    def save(self, entries: dict[str, ArchiveEntry]) -> None:
        """Write `entries` as the index (merged first: `merge`)."""
        write_atomically(self.path, pack_index(self.policy, entries))
        self.seen = stamp(self.path)
        self.synced, self.removed = set(entries), set()
