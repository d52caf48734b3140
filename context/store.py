"""Small msgpack files under $CODECTX_HOME, written atomically."""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

import msgpack

log = logging.getLogger(__name__)


def load(path: Path) -> dict:
    """The dict stored at `path`, or {} when it is missing or unreadable (then it is rebuilt)."""
    try:
        with open(path, "rb") as f:
            data = msgpack.unpack(f, raw=False, strict_map_key=False)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, msgpack.UnpackException) as err:
        log.warning("ignoring unreadable cache %s: %s", path, err)
        return {}
    return data if isinstance(data, dict) else {}


def save(path: Path, data: dict) -> None:
    """Writes `data` to `path` atomically (temp file + rename); logs and goes on on failure. The temporary
    file never stays behind: not after a failed write, nor after Ctrl-C (a cache file can be megabytes)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            msgpack.pack(data, f, use_bin_type=True)
        os.replace(tmp, path)
        tmp = None
    except OSError as err:
        log.warning("cannot write cache %s: %s", path, err)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
