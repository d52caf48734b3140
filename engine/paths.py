"""Where codectx keeps its files on the user's machine.

Everything lives under one home directory, ``$CODECTX_HOME`` when set and
``~/.cache/codectx`` otherwise, so a test or a user can move all state at once.
"""
from __future__ import annotations

import os
from pathlib import Path

_DEFAULT_HOME = Path("~/.cache/codectx")


def codectx_home() -> Path:
    """The root of codectx's per-user state (``$CODECTX_HOME`` or ``~/.cache/codectx``)."""
    configured = os.environ.get("CODECTX_HOME")
    return Path(configured).expanduser() if configured else _DEFAULT_HOME.expanduser()


def models_dir() -> Path:
    """The directory holding converted and fetched models (``<home>/models``)."""
    return codectx_home() / "models"
