"""Physical bounds measured in the same run as a benchmark: matmul peak, memory and disk bandwidth.

Used by bench/gpu_engine.py to print the bound next to each figure:

- `matmul_tflops`: a bf16 square matmul through MLX (the prefill's compute ceiling as MLX reaches it);
- `copy_bandwidth`: device memory read + write through MLX (decode's ceiling: bytes read per token);
- `disk_read`: sequential read of a fresh file, after dropping the page cache where the OS lets
  us (the restart's ceiling: bytes restored from the archive);
- `decode_bytes_per_token`: the bytes one decode step reads (weights without the embedding table,
  plus the KV cache at that context).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.timing import best_seconds

_READ_BLOCK = 64 << 20


def matmul_tflops(n: int = 8192, dtype: Any = mx.bfloat16, repeats: int = 5) -> float:
    """TFLOP/s of an n x n x n matmul in `dtype` (best of `repeats`)."""
    a = mx.random.normal((n, n), key=mx.random.key(1)).astype(dtype)
    b = mx.random.normal((n, n), key=mx.random.key(2)).astype(dtype)
    mx.eval(a, b)
    seconds = best_seconds(lambda: a @ b, repeats)
    return 2.0 * n**3 / seconds / 1e12


def copy_bandwidth(gib: float = 4.0, repeats: int = 5) -> float:
    """Device memory bandwidth in GB/s: bytes read + written by an elementwise copy (best of `repeats`)."""
    rows = int(gib * 2**30) // 2 // 4096  # 2-D: one dimension stays under 2**31 elements
    a = mx.zeros((rows, 4096), dtype=mx.bfloat16)
    mx.eval(a)
    seconds = best_seconds(lambda: a + 1, repeats)
    return 2.0 * a.nbytes / seconds / 1e9


def drop_page_cache() -> bool:
    """Write dirty pages and drop the page cache (root on Linux); False where that is not allowed."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def read_seconds(paths: list[Path]) -> tuple[int, float]:
    """Bytes in `paths` and the seconds a sequential read of all of them takes."""
    total, start = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while chunk := handle.read(_READ_BLOCK):
                total += len(chunk)
    return total, time.perf_counter() - start


def disk_read(directory: Path, gib: float = 4.0) -> dict[str, Any]:
    """Sequential read bandwidth (GB/s) of a fresh `gib` file: from disk (page cache dropped) and cached."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "disk-read-probe.bin"
    block = os.urandom(_READ_BLOCK)
    with open(path, "wb") as handle:
        for _ in range(max(1, int(gib * 2**30) // _READ_BLOCK)):
            handle.write(block)
        handle.flush()
        os.fsync(handle.fileno())
    dropped = drop_page_cache()
    size, cold = read_seconds([path])
    _, cached = read_seconds([path])
    path.unlink()
    return {"bytes": size, "cold_gbs": round(size / cold / 1e9, 2), "cached_gbs": round(size / cached / 1e9, 2),
            "page_cache_dropped": dropped}


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes of parameters one decode step reads: all of them but the embedding table (one row of it)."""
    total = 0
    embedding = getattr(getattr(model, "model", model), "embed_tokens", None)
    skipped = {id(p) for _, p in tree_flatten(embedding.parameters())} if embedding is not None else set()
    for _, p in tree_flatten(model.parameters()):
        if id(p) not in skipped:
            total += p.nbytes
    if embedding is not None:
        total += sum(p.nbytes // p.shape[0] for _, p in tree_flatten(embedding.parameters()))
    return total


def kv_bytes_per_token(args: Any, kv_bits: int, group: int = 64) -> int:
    """KV bytes per position over every layer: keys and values, 16-bit, or 8-bit with a
    16-bit scale and bias per `group` elements."""
    elements = 2 * args.num_hidden_layers * args.num_key_value_heads * args.head_dim
    if kv_bits == 16:
        return 2 * elements
    return elements + 2 * 2 * elements // group


def decode_bytes_per_token(model: nn.Module, context: int, kv_bits: int) -> int:
    """Bytes one decode step reads at `context` positions."""
    return weight_bytes_per_token(model) + context * kv_bytes_per_token(model.args, kv_bits)
