"""MLX settings that a process fixes before MLX starts: environment variables MLX reads once.

`apply` runs inside `engine.blas.preload`, the start-up step every entry point that runs a
model takes before importing `mlx.core`. A value the user set is kept.

- ``MLX_CUDA_GRAPH_CACHE_SIZE`` (MLX's default 100): MLX's CUDA backend records about 20
  operations per CUDA graph and keeps the instantiated graphs in a least-recently-used cache.
  One decode step of a 64-layer model is about 80 such graphs; an engine that also runs
  prefill chunks of several lengths, verify forwards and caches of two widths sees more
  distinct graphs than 100, and an evicted graph is instantiated again on its next use. On
  the H200 at 131k tokens, in one process that had first run the same steps at 32k, the decode
  step took 39.2 ms with the 8-bit cache and 27.1 ms with bf16 under the default, 20.3 and
  18.2 ms with 1,000 (docs/benchmarks.md, *GPU engine*, fifth session: the decode step's
  floor). Through the engine, and in `bench/gpu_step.py` with one fresh process per size, the
  difference has not shown (same section, runs g and h). The setting is inert on other backends.
"""
from __future__ import annotations

import os

DEFAULTS = {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"}


def apply() -> dict[str, str]:
    """Set each of `DEFAULTS` the environment does not already set; the values now in force."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    return current()


def current() -> dict[str, str]:
    """The values MLX runs with once `apply` has run (the user's, else ours), changing nothing."""
    return {name: os.environ.get(name, value) for name, value in DEFAULTS.items()}
