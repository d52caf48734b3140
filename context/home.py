"""Where codectx keeps its caches: $CODECTX_HOME, else ~/.cache/codectx."""
from __future__ import annotations

import os
from pathlib import Path


def codectx_home() -> Path:
    """The cache root (not created here)."""
    env = os.environ.get("CODECTX_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "codectx"
