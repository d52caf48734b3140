"""Buffers the host has read, given back to CUDA instead of to MLX's buffer cache.

On MLX's CUDA backend (0.32) reading an array's bytes on the host (NumPy, a file write) first moves its
buffer to CUDA managed memory (MLX's ``Buffer::raw_ptr``), and once the array is freed that buffer goes to
MLX's buffer cache, which the device's own buffers share. A later kernel's output of a size the cache
matches (equal sizes are handed out oldest first) may then be one of those managed buffers, whose pages
the read left on the host: the kernel faults them over to the GPU. The disk archive reads every
checkpoint it writes, thousands of 64 KiB scales and biases the size of a decode step's MLP
intermediates (Qwen3-32B's 25,600 bf16 values, rounded to 64 KiB), so after a 128k-token cold ask
the following asks decoded ~2.5 ms a token slower than the same loop without the archive's writes
(docs/benchmarks.md, *GPU engine*, twenty-fourth session). `release` empties MLX's cache
(`mx.clear_cache`): cached device buffers go back to CUDA's memory pool, which hands them out again
at little cost, and the managed ones are freed.

`RELEASE` turns it off (a benchmark's comparison row); other backends have no such cache split and
skip it.
"""
from __future__ import annotations

import mlx.core as mx

from engine import cuda_backend

RELEASE = True


def release() -> None:
    """Empty MLX's buffer cache after the host read arrays that are now freed (on CUDA; module docstring)."""
    if RELEASE and cuda_backend.cuda_available():
        mx.clear_cache()
