"""The disk archive: checkpoints that survive a restart.

Layout under ``CODECTX_HOME/archive/<policy fingerprint>/``: one safetensors
file per checkpoint holding its KV span [start, end) and its recurrent
snapshot, plus ``index.msgpack`` describing every entry (chain keys, tokens,
size, xxh3 checksum, last use). Spans chain like the in-memory checkpoints, so
the archive holds one copy of a prefix however many boundaries it has.

Every write is a temp file + rename; every load checks size and checksum. A
corrupt, truncated, foreign or orphaned file is removed, never trusted. Writes
run on a background thread (the MLX thread only hands over evaluated arrays).

Processes may share the folder (two asks at once, a server and a CLI): under its
lock file an index write merges with the disk's (others' rows kept and taken in,
ours removed left out, the cap over the union), a checkpoint file is renamed in
with its index row, and the sweep spares temp files of running writers.

The archive is an optimization and fails safe: a folder that cannot be
written (read-only, no permission, full) turns it off for the engine with one
warning, and requests go on with in-memory checkpoints. File names come only
from keys that have the engine's own form (16 hex digits) and resolve inside
the policy directory; an index naming anything else is not trusted.

Writes wait while a request runs (`paused`, entered by the engine around each
request) and go on between requests and at close: on MLX's CUDA backend each array
the writer reads is copied to the host synchronously, which slowed a 128k-token
decode from 33 to 21-31 tok/s (docs/benchmarks.md, *GPU engine*). Restores read
files ahead of the engine (`engine.archive_reads`).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import mlx.core as mx
import xxhash

from engine import archive_format
from engine.archive_entry import ArchiveEntry, IndexFile
from engine.archive_files import (FolderLock, is_plain_key, is_plain_policy, is_sound_file, read_regular, strays,
                                  write_atomically_with, write_failure)
from engine.archive_reads import INDEX_NAME, other_policy_has, read_ahead
from engine.boundaries import Boundary
from engine.errors import EngineError
from engine.paths import codectx_home
from engine.state import Arrays

log = logging.getLogger(__name__)

_SUFFIX = ".safetensors"


class ArchiveCorruptError(EngineError):
    """An archive entry whose file is missing, truncated or fails its checksum."""


class _LostWrite(Exception):
    """A checkpoint's temp file vanished before its rename (removed by hand, or by an older codectx's sweep)."""


def archive_root() -> Path:
    """``<codectx home>/archive``."""
    return codectx_home() / "archive"


def _prepared(boundary: Boundary, kv: Arrays, recurrent: Arrays) -> list[archive_format.Entry] | None:
    """The checkpoint's arrays made ready for its file, or None (one warning) when one cannot be archived."""
    try:
        return archive_format.prepare({**kv, **recurrent})
    except ValueError as err:  # an array safetensors cannot name: this checkpoint stays in memory only
        log.warning("not archiving the checkpoint %s at %d: %s", boundary.key, boundary.end, err)
        return None


class CheckpointArchive:
    """Archived checkpoints of one policy.

    Args:
        policy_fingerprint: Names the directory; entries of other policies are never read.
        cap_bytes: Size cap of this policy's directory; least recently used entries go
            first, when the archive opens and after every write.
        root: The archive root (default ``CODECTX_HOME/archive``).
        off_reason: Start switched off for this reason, touching no file (an engine
            whose archive failed keeps it off across policy switches).
    """

    def __init__(self, policy_fingerprint: str, cap_bytes: int, root: Path | None = None,
                 off_reason: str | None = None):
        self.policy_fingerprint = policy_fingerprint
        self.cap_bytes = cap_bytes
        self.root = Path(root) if root is not None else archive_root()
        self.directory = self.root / policy_fingerprint
        self.off_reason = off_reason
        self._folder = FolderLock(self.directory)  # `exclusive` around whatever touches the folder
        self._lock = self._folder.thread
        self._entries: dict[str, ArchiveEntry] = {}
        self._index = IndexFile(self.directory, policy_fingerprint)
        self._corrupt: set[str] = set()
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._may_write = threading.Event()  # cleared while a request runs (see `paused`)
        self._may_write.set()
        self._draining = False
        if off_reason is None:
            self._open()

    @property
    def state(self) -> str:
        """``"on"``, or ``"off: <reason>"`` once the folder failed."""
        return "on" if self.off_reason is None else f"off: {self.off_reason}"

    # -- reading (MLX thread) ---------------------------------------------

    def get(self, key: str) -> ArchiveEntry | None:
        """The entry for a chained key, if archived (by this process or, since the index last changed, another)."""
        self._refresh()
        with self._lock:
            return self._entries.get(key)

    def children(self, parent: str) -> list[Boundary]:
        """Boundaries of the entries chaining from `parent`."""
        self._refresh()
        with self._lock:
            return [e.boundary() for e in self._entries.values() if e.parent == parent]

    def was_corrupt(self, key: str) -> bool:
        """True if the entry for `key` was removed because it failed verification."""
        return key in self._corrupt

    def other_policy_has(self, token_key: str) -> bool:
        """True if another policy's directory archived the same tokens (`engine.archive_reads.other_policy_has`)."""
        return self.off_reason is None and other_policy_has(self.root, self.policy_fingerprint, token_key)

    def load(self, entry: ArchiveEntry, data: bytes | Exception | None = None) -> tuple[Arrays, Arrays]:
        """The KV span and recurrent snapshot of `entry`, after checking size and checksum.

        Args:
            data: The entry's file as `read_ahead` read it (or its read error); None reads it now.

        Raises:
            ArchiveCorruptError: The file is missing, truncated or altered (the
                entry and its descendants are removed), or the archive is off.
        """
        if self.off_reason is not None or self.get(entry.key) is not entry:
            raise ArchiveCorruptError(f"archive entry {entry.key} is gone ({self.state})")
        path = self._file(entry.key)
        try:
            data = self._read(entry) if data is None else data  # read once: checked, then parsed from memory
            if isinstance(data, Exception):
                raise ArchiveCorruptError(f"{path.name}: unreadable: {data}") from data
            if (len(data), xxhash.xxh3_64_hexdigest(data)) != (entry.size, entry.checksum):
                raise ArchiveCorruptError(f"{path.name}: size/checksum mismatch")
            arrays = mx.load(io.BytesIO(data), format="safetensors")
            mx.eval(list(arrays.values()))  # now: a bad file fails here, and its bytes can go
        except (OSError, ValueError, RuntimeError, ArchiveCorruptError) as err:
            self._corrupt.add(entry.key)
            self._write_index(drop=entry)
            raise ArchiveCorruptError(f"archive entry {entry.key} is unusable: {err}") from err
        entry.last_used = time.time()
        kv = {k: v for k, v in arrays.items() if ".kv." in k}
        rec = {k: v for k, v in arrays.items() if ".rec." in k}
        return kv, rec

    def read_ahead(self, entries: list[ArchiveEntry]) -> Iterator[tuple[ArchiveEntry, bytes | Exception]]:
        """`entries` with their files' bytes, read on helper threads ahead of the caller (for `load`)."""
        return read_ahead(entries, self._read)

    def _read(self, entry: ArchiveEntry) -> bytes:
        return read_regular(self._file(entry.key), entry.size)

    # -- writing (background thread) ---------------------------------------

    def submit(self, boundary: Boundary, kv: Arrays, recurrent: Arrays) -> None:
        """Queue a checkpoint for writing (call on the MLX thread: its arrays are made ready here)."""
        if self.off_reason is not None:
            return
        entries = _prepared(boundary, kv, recurrent)
        if entries is None:
            return
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="codectx-archive", daemon=True)
            self._writer.start()
        self._queue.put((boundary, entries))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Queued writes wait while this block runs (a request); a write under way stops before its next array."""
        if not self._draining:
            self._may_write.clear()
        try:
            yield
        finally:
            self._may_write.set()

    def flush(self) -> None:
        """Block until every queued checkpoint is written (paused or not)."""
        if self._writer is not None:
            self._draining = True
            self._may_write.set()
            try:
                self._queue.join()
            finally:
                self._draining = False

    def close(self) -> None:
        """Write what is queued, stop the writer and save the index."""
        if self._writer is not None:
            self.flush()
            self._queue.put(None)
            self._writer.join()
            self._writer = None
        self._write_index()

    def put(self, boundary: Boundary, kv: Arrays, recurrent: Arrays) -> ArchiveEntry | None:
        """Write one checkpoint now (atomically, array by array: `engine.archive_format`) and enforce
        the size cap; on the MLX thread.

        Returns:
            The entry, or None when the archive is off (or turned off by this write) or an array has
            a dtype safetensors cannot name (logged; the checkpoint stays in memory only).
        """
        entries = _prepared(boundary, kv, recurrent)
        return None if entries is None else self._put(boundary, entries)

    def _put(self, boundary: Boundary, entries: list[archive_format.Entry],
             between: Callable[[], None] | None = None) -> ArchiveEntry | None:
        """`put` of prepared entries; `between` runs before each array (the writer waits there during a request)."""
        if self.off_reason is not None:
            return None
        if not is_plain_key(boundary.key):
            log.warning("not archiving a checkpoint with the malformed key %r", boundary.key)
            return None
        final = self._file(boundary.key)
        checksum = xxhash.xxh3_64()
        metadata = {"key": boundary.key, "policy": self.policy_fingerprint}
        written: list[ArchiveEntry] = []

        def fill(handle) -> None:  # the long part, outside the folder's lock
            size = archive_format.write(handle, entries, metadata, checksum.update, between)
            written.append(ArchiveEntry.from_boundary(boundary, size, checksum.hexdigest()))

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomically_with(final, fill, rename=lambda tmp, dst: self._place(tmp, dst, written[0]))
        except _LostWrite as err:
            log.warning("archive: lost the write of %s (%s)", final.name, err)
            return None
        except OSError as err:
            self._turn_off(write_failure(err, final))
            return None
        return written[0] if self.off_reason is None else None

    def _place(self, tmp: Path, final: Path, entry: ArchiveEntry) -> None:
        """Rename a written checkpoint file into place and index it under the folder's lock (another
        process's sweep or merge sees the file with its row, or neither). Raises `_LostWrite` when
        the temp file is gone (one lost checkpoint, not a folder that fails), OSError otherwise."""
        with self._folder.exclusive():
            try:
                os.replace(tmp, final)
            except FileNotFoundError as err:
                if os.path.lexists(tmp):  # the temp is there: the destination failed
                    raise
                raise _LostWrite(f"its temp file {tmp.name} was removed meanwhile") from err
            self._entries[entry.key] = entry
            self._corrupt.discard(entry.key)
            self._write_index(fresh=entry.key)
            if self.off_reason is not None:  # the index could not name it (a full disk): no orphan left
                final.unlink(missing_ok=True)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._may_write.wait()
                self._put(*item, between=self._may_write.wait)
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

    def _turn_off(self, reason: str) -> None:
        """Stop using the disk for this archive: one warning, then memory-only checkpoints."""
        with self._lock:
            if self.off_reason is None:
                self.off_reason = reason
                log.warning("archive off: %s (checkpoints stay in memory only)", reason)
            self._entries.clear()

    def _open(self) -> None:
        """Under the folder's lock, load the index; drop entries without a sound file and files without an entry.

        Then apply the size cap and save the index, so a folder that cannot be
        written is found (and the archive turned off) before the first request.
        """
        if not is_plain_policy(self.policy_fingerprint):
            self._turn_off(f"policy {self.policy_fingerprint!r} is not a plain directory name")
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if self.directory.is_symlink():
                self._turn_off(f"{self.directory} is a symbolic link")
                return
            with self._folder.exclusive():
                entries = self._index.read() or {}
                self._entries = {k: e for k, e in entries.items() if self._sound_file(e)}
                self._enforce_cap()
                self._remove_unknown_files()
                if self.off_reason is None:
                    self._index.save(self._entries)
        except OSError as err:
            self._turn_off(write_failure(err, self.directory))

    def _sound_file(self, e: ArchiveEntry) -> bool:
        """True when the entry's file is a regular file inside the directory with its size."""
        if is_sound_file(self._file(e.key), self.directory, e.size):
            return True
        log.warning("dropping archive entry %s (missing, truncated or not a plain file)", e.key)
        self._corrupt.add(e.key)
        return False

    def _remove_unknown_files(self) -> None:
        """Unlink files and links the index does not name (links themselves, never targets)."""
        known = {self._file(k).name for k in self._entries} | {INDEX_NAME}
        for stray in strays(self.directory, known):
            log.info("removing foreign archive file %s", stray)
            stray.unlink(missing_ok=True)

    def _remove_tree(self, key: str) -> None:
        doomed = {key}
        for e in sorted(self._entries.values(), key=lambda e: e.end):
            if e.parent in doomed:
                doomed.add(e.key)
        try:
            for k in doomed:
                if self._entries.pop(k, None) is not None:
                    self._index.removed.add(k)  # kept out when the index merges with the disk's
                    self._file(k).unlink(missing_ok=True)
        except OSError as err:
            self._turn_off(write_failure(err, self.directory))

    def _enforce_cap(self) -> None:
        """Least recently used first, protected last; only leaves, so a kept entry keeps its prefix."""
        while self._entries and sum(e.size for e in self._entries.values()) > self.cap_bytes:
            parents = {e.parent for e in self._entries.values()}
            leaves = [e for e in self._entries.values() if e.key not in parents]
            victim = min(leaves or self._entries.values(),  # no leaf only in a looping crafted index
                         key=lambda e: (e.protected, e.last_used, -e.end))
            self._remove_tree(victim.key)

    def _refresh(self) -> None:
        """Take in the rows other processes wrote since this instance last read or wrote the index (a stat
        when nothing changed). A failure leaves the rows in memory as they are."""
        if self.off_reason is not None or not self._index.changed():
            return
        try:
            with self._folder.exclusive():
                self._index.merge(self._entries, self._sound_file)
        except OSError as err:
            log.debug("archive index not re-read: %s", err)

    def _write_index(self, fresh: str = "", drop: ArchiveEntry | None = None) -> None:
        """Merge with the index on disk (`IndexFile.merge`), remove `drop` (failed verification) and its
        descendants unless another process rewrote it meanwhile, apply the cap over the union and write
        the index, all under the folder's lock; a failure turns the archive off."""
        if self.off_reason is not None:
            return
        try:
            with self._folder.exclusive():
                self._index.merge(self._entries, self._sound_file, fresh)
                if drop is not None and self._entries.get(drop.key) is drop:
                    self._remove_tree(drop.key)
                self._enforce_cap()
                if self.off_reason is None:
                    self._index.save(self._entries)
        except OSError as err:
            self._turn_off(write_failure(err, self.directory / INDEX_NAME))
