"""The in-process MLX engine: model loading, prefill/decode, KV caches.

The only package that imports MLX. Importing `engine` has no side effect and
stays light (`engine.request`, `engine.errors` need no MLX); `Engine` and
friends are imported on first use. Entry points that run a model call
`engine.blas.preload()` themselves, once, before `mlx.core` is imported.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Engine": "engine.engine",
    "RequestHandle": "engine.handle",
    "load_model": "engine.loading",
    "LoadedModel": "engine.loaded_model",
    "ComputeOptions": "engine.compute_options",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
