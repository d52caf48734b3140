"""File-level safety for the disk archive: plain names, regular-file reads, atomic writes.

The archive trusts nothing it reads back from disk: a name comes from an
index only if it has the form the engine itself writes, a read never follows
a link or reads past the size it expects, and a write goes to a freshly
created temp file renamed into place, so a planted link is never written
through and a full disk raises instead of leaving a short file.

Several processes may share one policy folder: `directory_lock` orders their
index updates, and `strays` leaves alone the temp files of writers still running.
"""
from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TypeVar

try:
    import fcntl
except ImportError:  # not POSIX: `directory_lock` locks nothing (see there)
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")

LOCK_NAME = ".lock"
_KEY = re.compile(r"[0-9a-f]{16}")  # engine.checkpoints' chained xxh3_64 hex digest
_POLICY = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")  # one directory name, no dots or separators
_TEMP = re.compile(r"\..+\.([0-9]{1,10})\.[0-9]+\.tmp")  # `write_atomically_with`'s temp: .{name}.{pid}.{thread}.tmp
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
_LOCK_FLAGS = os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def is_plain_key(key: object) -> bool:
    """True for a checkpoint key of the form the engine writes (16 lowercase hex digits)."""
    return isinstance(key, str) and _KEY.fullmatch(key) is not None


def is_plain_policy(name: object) -> bool:
    """True for a policy fingerprint usable as one directory name."""
    return isinstance(name, str) and _POLICY.fullmatch(name) is not None


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path`, a regular file (a link is not followed) of at most `limit` bytes.

    Raises:
        OSError: Missing, unreadable, a link, not a regular file, or too large.
    """
    fd = os.open(path, _READ_FLAGS)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise OSError(f"{path.name} is not a regular file of at most {limit} bytes")
        return handle.read(limit + 1)


def write_atomically(final: Path, data: bytes) -> None:
    """Write `data` to a new temp file beside `final`, then rename it over `final`.

    Raises:
        OSError: Any failure (no permission, read-only, no space); the temp file is removed.
    """
    write_atomically_with(final, lambda handle: handle.write(data))


def write_atomically_with(final: Path, fill: Callable[[BinaryIO], T],
                          rename: Callable[[Path, Path], object] = os.replace) -> T:
    """`fill` writes a new temp file beside `final`, which `rename(temp, final)` then renames over
    `final`; fill's result. (The archive renames under its directory lock: `engine.archive`.)

    Raises:
        OSError: Any failure (no permission, read-only, no space); whatever `fill` or `rename` raise.
            The temp file is removed in every case.
    """
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "xb") as handle:  # exclusive create: never through a planted link
            result = fill(handle)
        rename(tmp, final)
        return result
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Hold the lock file of `directory` (`.lock`, created when absent, never through a link) exclusively.

    Another process waits, and so does another open of it in this process (a flock belongs to the
    open file, not to the process): a caller that re-enters must not take it twice.

    Raises:
        OSError: The lock file cannot be opened (the folder is gone, read-only, or `.lock` is a link).
    """
    if fcntl is None:  # not POSIX: the caller's threading lock alone orders this process's threads;
        yield          # processes sharing the folder are not ordered and may lose each other's index rows
        return
    fd = os.open(directory / LOCK_NAME, _LOCK_FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class FolderLock:
    """A re-entrant threading lock (`thread`) that in `exclusive` also holds the folder's lock file
    (`directory_lock`), keeping this process's other threads and other processes out together."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.thread = threading.RLock()
        self._held = False  # the lock file is held (changed only under `thread`)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Both locks; re-entrant in the holding thread.

        Raises:
            OSError: The lock file cannot be opened.
        """
        with self.thread:
            if self._held:
                yield
                return
            with directory_lock(self.directory):
                self._held = True
                try:
                    yield
                finally:
                    self._held = False


def writer_alive(name: str) -> bool:
    """True when `name` is a temp file of `write_atomically_with` whose writing process still runs."""
    match = _TEMP.fullmatch(name)
    pid = int(match.group(1)) if match else 0
    if not 0 < pid < 2 ** 31:  # not a temp name (and never kill(0), our own process group)
        return False
    if os.name != "posix":  # kill(pid, 0) would end the process there: count the writer as running
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def strays(directory: Path, known: set[str]) -> list[Path]:
    """Files and links in `directory` that `known` does not name, less the lock file and the temp
    files of writers still running (another process's checkpoint half written); no folders."""
    with os.scandir(directory) as scan:
        return [Path(d.path) for d in scan if d.name not in known and d.name != LOCK_NAME
                and not d.is_dir(follow_symlinks=False) and not writer_alive(d.name)]


def is_sound_file(path: Path, directory: Path, size: int) -> bool:
    """True when `path` is a regular file (not a link) of `size` bytes inside `directory`."""
    try:
        info = path.lstat()
        inside = path.resolve().parent == directory.resolve()  # defence in depth
    except OSError:
        return False
    return inside and stat.S_ISREG(info.st_mode) and info.st_size == size


def stamp(path: Path) -> tuple[int, ...] | None:
    """What changes whenever `path` is replaced or rewritten (inode, times, size); None when missing."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size


def write_failure(err: OSError, path: Path) -> str:
    """A short cause for an "archive off" message: what could not be written, and why."""
    return f"cannot write {err.filename or path}: {err.strerror or err}"


def probe(root: Path) -> str | None:
    """Why an archive under `root` would be off, or None when it can be written.

    Creates `root` if needed and writes and removes one small file in it.
    """
    target = root / f".probe-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        write_atomically(target, b"probe")
        target.unlink()
    except OSError as err:
        return write_failure(err, root)
    return None
