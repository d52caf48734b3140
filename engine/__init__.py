"""The in-process MLX engine: model loading, prefill/decode, KV caches.

The only package that imports MLX. Importing `engine` itself stays light
(`engine.request`, `engine.errors` need no MLX); `Engine` and friends are
imported on first use. When the CPU BLAS preloader (`engine.blas`) is
present it runs first, before anything can import `mlx.core`.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

if importlib.util.find_spec(f"{__name__}.blas") is not None:
    from . import blas as _blas

    _blas.preload()

_LAZY = {
    "Engine": "engine.engine",
    "RequestHandle": "engine.handle",
    "load_model": "engine.loading",
    "LoadedModel": "engine.loading",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
