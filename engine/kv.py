"""Per-layer caches for one request: fp16/fp32 KV (16 bits) or 8-bit quantized KV.

mlx-lm's own `kv_bits` path converts a cache only once it holds
`quantized_kv_start` (5000) tokens, so short prompts silently stay
unquantized. Here an 8-bit cache is quantized from token 0.

Recurrent layers of hybrid models (mlx-lm `ArraysCache`) are kept as the
model makes them; sliding-window layers get `engine.window.SlidingKVCache`
(checkpoints need every cache position-addressed).
"""
from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from engine.window import sliding_cache

SUPPORTED_KV_BITS = (8, 16)
KV_GROUP_SIZE = 64


def make_cache(model: Any, kv_bits: int = 16, group_size: int = KV_GROUP_SIZE) -> list[Any]:
    """Build a fresh per-layer cache for `model`.

    Args:
        model: An mlx-lm model.
        kv_bits: 16 keeps keys/values in the model's dtype; 8 stores them
            quantized (affine, `group_size` elements per scale) from the first token.
        group_size: Quantization group size for `kv_bits=8`; must divide the head dim.

    Returns:
        One cache object per layer, as `model(..., cache=...)` expects.

    Raises:
        ValueError: For unsupported `kv_bits`.
    """
    if kv_bits not in SUPPORTED_KV_BITS:
        raise ValueError(f"kv_bits must be one of {SUPPORTED_KV_BITS}, got {kv_bits}")
    cache = [sliding_cache(c, kv_bits, group_size) if type(c) is RotatingKVCache else c
             for c in make_prompt_cache(model)]
    if kv_bits == 16:
        return cache
    # Exact type check: subclasses (windowed) keep their own policy.
    return [QuantizedKVCache(group_size=group_size, bits=kv_bits) if type(c) is KVCache else c
            for c in cache]


def cache_offset(cache: list[Any]) -> int:
    """Tokens held by the first attention layer of `cache` (0 for an empty cache)."""
    for c in cache:
        offset = getattr(c, "offset", None)
        if offset is not None:
            return int(offset)
    return 0

