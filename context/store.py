"""Small msgpack files under $CODECTX_HOME, written atomically and framed with a checksum.

A file is `{"format": FORMAT, "xxh3": <hex digest of data>, "data": <msgpack of the dict>}`: a
file whose bytes changed after it was written (a disk error, a hand edit) is ignored as a whole
and rebuilt, not trusted because it still parses. Rows of the right frame but the wrong shape
are the reader's to check (`load`'s `row`).
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import msgpack
import xxhash

log = logging.getLogger(__name__)

FORMAT = 2  # 1: the bare dict, without a checksum


def load(path: Path, row: Callable[[Any, Any], bool] | None = None) -> dict:
    """The dict stored at `path`, or {} when it is missing, unreadable, of another format or its
    checksum does not match (then it is rebuilt). `row(key, value)`: False drops that row (logged)."""
    try:
        with open(path, "rb") as f:
            frame = msgpack.unpack(f, raw=False)
        if not isinstance(frame, dict) or frame.get("format") != FORMAT or not isinstance(frame.get("data"), bytes):
            raise ValueError("not a cache file of this version")
        if xxhash.xxh3_64_hexdigest(frame["data"]) != frame.get("xxh3"):
            raise ValueError("checksum mismatch: changed since it was written")
        data = msgpack.unpackb(frame["data"], raw=False, strict_map_key=False)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, msgpack.UnpackException) as err:
        log.warning("ignoring unreadable cache %s: %s", path, err)
        return {}
    if not isinstance(data, dict):
        return {}
    if row is not None:
        bad = [key for key, value in data.items() if not row(key, value)]
        if bad:
            log.warning("dropping %d malformed rows of cache %s", len(bad), path)
            for key in bad:
                del data[key]
    return data


def save(path: Path, data: dict) -> None:
    """Writes `data` to `path` atomically (temp file + rename); logs and goes on on failure. The temporary
    file never stays behind: not after a failed write, nor after Ctrl-C (a cache file can be megabytes)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        blob = msgpack.packb(data, use_bin_type=True)
        with os.fdopen(fd, "wb") as f:
            msgpack.pack({"format": FORMAT, "xxh3": xxhash.xxh3_64_hexdigest(blob), "data": blob}, f,
                         use_bin_type=True)
        os.replace(tmp, path)
        tmp = None
        _remove_stale_temps(path)
    except OSError as err:
        log.warning("cannot write cache %s: %s", path, err)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


STALE_TEMP_S = 600.0
"""A temp file of a cache this old was left by a killed process (a live writer's is seconds old)."""


def _remove_stale_temps(path: Path) -> None:
    """Removes temp files of `path` that a killed process left (`save` itself never leaves one)."""
    now = time.time()
    for stale in path.parent.glob(glob.escape(path.name) + "*.tmp"):
        with contextlib.suppress(OSError):
            if now - stale.lstat().st_mtime > STALE_TEMP_S:
                stale.unlink()
