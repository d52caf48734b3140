"""MLX settings that a process fixes before MLX starts: environment variables MLX reads once.

`apply` runs inside `engine.blas.preload`, the start-up step every entry point that runs a
model takes before importing `mlx.core`. A value the user set is kept.

- ``MLX_CUDA_GRAPH_CACHE_SIZE`` (MLX's default 100): MLX's CUDA backend records operations into
  a CUDA graph until it holds 100 of them or 1,000 MB of inputs (on Hopper; 20 and 100 MB on most
  other GPUs) and keeps the instantiated graphs in a least-recently-used cache. At 131k keys one
  layer of a Qwen3-32B-shaped model reads 274 MB of weights and 280-540 MB of KV buffers, so one
  decode step of its 64 layers is, by that rule, 32-64 graphs (derived, not counted); an engine that also runs
  prefill chunks of several lengths, verify forwards and caches of two widths sees more
  distinct graphs than 100, and an evicted graph is instantiated again on its next use. On
  the H200 at 131k tokens, in one process that had first run the same steps at 32k, the decode
  step took 39.2 ms with the 8-bit cache and 27.1 ms with bf16 under the default, 20.3 and
  18.2 ms with 1,000 (docs/benchmarks.md, *GPU engine*, fifth session: the decode step's
  floor; scratch probes). In `bench/gpu_step.py`, one fresh process per size, each running the
  32k steps before the 131k ones (sixth session, run h: bench/results/gpu_step-20261204h.json
  and gpu_step-100-20261204h.json), the 131k step took 35.15 ms (bf16) and 40.39 ms (8-bit)
  under the default against 24.65 and 37.88 ms with 1,000; at 32k the two sizes did not differ
  (19.17 / 19.91, 37.43 / 35.92). Through the engine the difference has not shown (fifth
  session, run g against run f; one run each). The setting is inert on other backends.
"""
from __future__ import annotations

import os

DEFAULTS = {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"}
REPORTED = ("MLX_MAX_OPS_PER_BUFFER", "MLX_MAX_MB_PER_BUFFER")
"""Settings we leave to MLX but report where the user set them (in `current`: the doctor's line, each GPU
benchmark's JSON): how many operations and input megabytes MLX records into one CUDA graph before it
closes it (100 and 1,000 on Hopper)."""


def apply() -> dict[str, str]:
    """Set each of `DEFAULTS` the environment does not already set; the values now in force."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    return current()


def current() -> dict[str, str]:
    """The values MLX runs with once `apply` has run (the user's, else ours), and those of `REPORTED` the user
    set; changing nothing."""
    ours = {name: os.environ.get(name, value) for name, value in DEFAULTS.items()}
    return {**ours, **{name: os.environ[name] for name in REPORTED if name in os.environ}}
