"""The disk archive: checkpoints that survive a restart.

Layout under ``CODECTX_HOME/archive/<policy fingerprint>/``: one safetensors
file per checkpoint holding its KV span [start, end) and its recurrent
snapshot, plus ``index.msgpack`` describing every entry (chain keys, tokens,
size, xxh3 checksum, last use). Spans chain like the in-memory checkpoints, so
the archive holds one copy of a prefix however many boundaries it has.

Every write is a temp file + rename; every load checks size and checksum. A
corrupt, truncated, foreign or orphaned file is removed, never trusted. Writes
run on a background thread (the MLX thread only hands over evaluated arrays).
"""
from __future__ import annotations

import io
import logging
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx
import msgpack
import xxhash

from engine.checkpoints import Boundary
from engine.errors import EngineError
from engine.paths import codectx_home
from engine.state import Arrays

log = logging.getLogger(__name__)

INDEX_NAME = "index.msgpack"
FORMAT_VERSION = 1
_SUFFIX = ".safetensors"


class ArchiveCorruptError(EngineError):
    """An archive entry whose file is missing, truncated or fails its checksum."""


def archive_root() -> Path:
    """``<codectx home>/archive``."""
    return codectx_home() / "archive"


@dataclass
class ArchiveEntry:
    """One archived checkpoint: a Boundary plus where its arrays are and how to check them."""

    key: str
    token_key: str
    parent: str
    start: int
    end: int
    tokens: bytes
    kind: str
    protected: bool
    size: int
    checksum: str
    last_used: float

    @classmethod
    def from_boundary(cls, b: Boundary, size: int, checksum: str) -> ArchiveEntry:
        return cls(b.key, b.token_key, b.parent, b.start, b.end, b.tokens, b.kind,
                   b.protected, size, checksum, time.time())

    def boundary(self) -> Boundary:
        return Boundary(self.key, self.token_key, self.parent, self.start, self.end,
                        self.tokens, self.kind, self.protected)

    def matches(self, b: Boundary) -> bool:
        """Verified on tokens and position, not only on the hash."""
        return (self.parent, self.start, self.end, self.tokens) == (b.parent, b.start, b.end, b.tokens)


def _checksum(path: Path) -> tuple[int, str]:
    data = path.read_bytes()
    return len(data), xxhash.xxh3_64_hexdigest(data)


class CheckpointArchive:
    """Archived checkpoints of one policy.

    Args:
        policy_fingerprint: Names the directory; entries of other policies are never read.
        cap_bytes: Size cap of this policy's directory; least recently used entries go first.
        root: The archive root (default ``CODECTX_HOME/archive``).
    """

    def __init__(self, policy_fingerprint: str, cap_bytes: int, root: Path | None = None):
        self.policy_fingerprint = policy_fingerprint
        self.cap_bytes = cap_bytes
        self.root = Path(root) if root is not None else archive_root()
        self.directory = self.root / policy_fingerprint
        self._lock = threading.Lock()
        self._entries: dict[str, ArchiveEntry] = {}
        self._corrupt: set[str] = set()
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._open()

    # -- reading (MLX thread) ---------------------------------------------

    def get(self, key: str) -> ArchiveEntry | None:
        """The entry for a chained key, if archived."""
        with self._lock:
            return self._entries.get(key)

    def children(self, parent: str) -> list[Boundary]:
        """Boundaries of the entries chaining from `parent`."""
        with self._lock:
            return [e.boundary() for e in self._entries.values() if e.parent == parent]

    def was_corrupt(self, key: str) -> bool:
        """True if the entry for `key` was removed because it failed verification."""
        return key in self._corrupt

    def other_policy_has(self, token_key: str) -> bool:
        """True if another policy's directory archived the same tokens."""
        for index in self.root.glob(f"*/{INDEX_NAME}"):
            if index.parent == self.directory:
                continue
            try:
                entries = msgpack.unpackb(index.read_bytes(), raw=False)["entries"]
            except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException):
                continue
            if any(e.get("token_key") == token_key for e in entries.values()):
                return True
        return False

    def load(self, entry: ArchiveEntry) -> tuple[Arrays, Arrays]:
        """The KV span and recurrent snapshot of `entry`, after checking size and checksum.

        Raises:
            ArchiveCorruptError: The file is missing, truncated or altered; the
                entry and its descendants are removed.
        """
        path = self._file(entry.key)
        try:
            data = path.read_bytes()  # read once: checked, then parsed from memory
            if (len(data), xxhash.xxh3_64_hexdigest(data)) != (entry.size, entry.checksum):
                raise ArchiveCorruptError(f"{path.name}: size/checksum mismatch")
            arrays = mx.load(io.BytesIO(data), format="safetensors")
        except (OSError, ValueError, RuntimeError, ArchiveCorruptError) as err:
            with self._lock:
                self._corrupt.add(entry.key)
                self._remove_tree(entry.key)
                self._write_index()
            raise ArchiveCorruptError(f"archive entry {entry.key} is unusable: {err}") from err
        entry.last_used = time.time()
        kv = {k: v for k, v in arrays.items() if ".kv." in k}
        rec = {k: v for k, v in arrays.items() if ".rec." in k}
        return kv, rec

    # -- writing (background thread) ---------------------------------------

    def submit(self, boundary: Boundary, kv: Arrays, recurrent: Arrays) -> None:
        """Queue a checkpoint for writing; `kv` and `recurrent` must be evaluated."""
        mx.eval(list(kv.values()) + list(recurrent.values()))
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="codectx-archive",
                                            daemon=True)
            self._writer.start()
        self._queue.put((boundary, kv, recurrent))

    def flush(self) -> None:
        """Block until every queued checkpoint is written."""
        if self._writer is not None:
            self._queue.join()

    def close(self) -> None:
        """Write what is queued, stop the writer and save the index."""
        if self._writer is not None:
            self.flush()
            self._queue.put(None)
            self._writer.join()
            self._writer = None
        with self._lock:
            self._write_index()

    def put(self, boundary: Boundary, kv: Arrays, recurrent: Arrays) -> ArchiveEntry:
        """Write one checkpoint now (atomically) and enforce the size cap."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self._file(boundary.key)
        tmp = final.with_name(f".{boundary.key}.{threading.get_ident()}.tmp{_SUFFIX}")
        mx.save_safetensors(str(tmp), {**kv, **recurrent},
                            metadata={"key": boundary.key, "policy": self.policy_fingerprint})
        size, checksum = _checksum(tmp)
        os.replace(tmp, final)
        entry = ArchiveEntry.from_boundary(boundary, size, checksum)
        with self._lock:
            self._entries[entry.key] = entry
            self._corrupt.discard(entry.key)
            self._enforce_cap()
            self._write_index()
        return entry

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self.put(*item)
            except Exception:  # noqa: BLE001 - a failed write must not kill the writer
                log.exception("archiving checkpoint failed")
            finally:
                self._queue.task_done()

    # -- bookkeeping -------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes of archived checkpoint files."""
        with self._lock:
            return sum(e.size for e in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _file(self, key: str) -> Path:
        return self.directory / f"{key}{_SUFFIX}"

    def _open(self) -> None:
        """Load the index; drop entries without a sound file and files without an entry."""
        if not self.directory.is_dir():
            return
        index = self.directory / INDEX_NAME
        try:
            raw = msgpack.unpackb(index.read_bytes(), raw=False)
            if raw.get("format") != FORMAT_VERSION or raw.get("policy") != self.policy_fingerprint:
                raise ValueError("foreign index")
            entries = {k: ArchiveEntry(**v) for k, v in raw["entries"].items()}
        except FileNotFoundError:
            entries = {}
        except (OSError, ValueError, KeyError, TypeError, msgpack.UnpackException) as err:
            log.warning("ignoring archive index %s: %s", index, err)
            entries = {}
        for key, e in list(entries.items()):
            path = self._file(key)
            if not path.is_file() or path.stat().st_size != e.size:
                log.warning("dropping archive entry %s (missing or truncated file)", key)
                self._corrupt.add(key)
                del entries[key]
        self._entries = entries
        known = {self._file(k).name for k in entries} | {INDEX_NAME}
        for path in self.directory.iterdir():
            if path.name not in known and path.is_file():
                log.info("removing foreign archive file %s", path)
                path.unlink(missing_ok=True)
        with self._lock:
            self._write_index()

    def _remove_tree(self, key: str) -> None:
        doomed = {key}
        for e in sorted(self._entries.values(), key=lambda e: e.end):
            if e.parent in doomed:
                doomed.add(e.key)
        for k in doomed:
            self._entries.pop(k, None)
            self._file(k).unlink(missing_ok=True)

    def _enforce_cap(self) -> None:
        while self._entries and sum(e.size for e in self._entries.values()) > self.cap_bytes:
            victim = min(self._entries.values(),
                         key=lambda e: (e.protected, e.last_used, -e.end))
            self._remove_tree(victim.key)

    def _write_index(self) -> None:
        if not self.directory.is_dir():
            return
        payload = msgpack.packb({
            "format": FORMAT_VERSION,
            "policy": self.policy_fingerprint,
            "entries": {k: asdict(e) for k, e in self._entries.items()},
        }, use_bin_type=True)
        tmp = self.directory / f".{INDEX_NAME}.{threading.get_ident()}.tmp"
        tmp.write_bytes(payload)
        os.replace(tmp, self.directory / INDEX_NAME)
