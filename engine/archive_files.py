"""File-level safety for the disk archive: plain names, regular-file reads, atomic writes.

The archive trusts nothing it reads back from disk: a name comes from an
index only if it has the form the engine itself writes, a read never follows
a link or reads past the size it expects, and a write goes to a freshly
created temp file renamed into place, so a planted link is never written
through and a full disk raises instead of leaving a short file.
"""
from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path
from typing import BinaryIO, Callable, TypeVar

T = TypeVar("T")

_KEY = re.compile(r"[0-9a-f]{16}")  # engine.checkpoints' chained xxh3_64 hex digest
_POLICY = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")  # one directory name, no dots or separators
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)


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


def write_atomically_with(final: Path, fill: Callable[[BinaryIO], T]) -> T:
    """`fill` writes a new temp file beside `final`, which is then renamed over `final`; fill's result.

    Raises:
        OSError: Any failure (no permission, read-only, no space); whatever `fill` raises.
            The temp file is removed in every case.
    """
    tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "xb") as handle:  # exclusive create: never through a planted link
            result = fill(handle)
        os.replace(tmp, final)
        return result
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


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
