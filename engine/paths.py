"""Where codectx keeps its files on the user's machine.

Everything lives under one home directory, ``$CODECTX_HOME`` when set and
``~/.cache/codectx`` otherwise, so a test or a user can move all state at once.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

_DEFAULT_HOME = Path("~/.cache/codectx")


def codectx_home() -> Path:
    """The root of codectx's per-user state (``$CODECTX_HOME`` or ``~/.cache/codectx``)."""
    configured = os.environ.get("CODECTX_HOME")
    return Path(configured).expanduser() if configured else _DEFAULT_HOME.expanduser()


def models_dir() -> Path:
    """The directory holding converted and fetched models (``<home>/models``)."""
    return codectx_home() / "models"


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (blocks until the holder releases it).

    Args:
        path: The lock file (created when absent).
        what: What the lock guards, for the log line while waiting.
    """
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process to finish preparing %s", what)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_stale_staging(parent: Path, name: str) -> None:
    """Remove the staging directories (`.<name>.*`) an interrupted build of `name` left in `parent`."""
    for leftover in parent.glob(f".{name}.*"):
        if leftover.is_dir():
            log.info("removing %s left by an interrupted build", leftover)
            shutil.rmtree(leftover, ignore_errors=True)
