"""The live cache an engine starts with, and the checkpoint policy that names it.

`policy_and_cache` folds everything but the tokens that decides what the cache
holds (model, weights, dtype, KV bits, window, prefill chunk, the resolved
compute path) into one `CachePolicy`, and builds the live cache those choices
need: None (the plain `engine.kv` caches) or `engine.window`'s caches.
"""
from __future__ import annotations

from typing import Any

from engine.compute import ComputePath
from engine.kv import KV_GROUP_SIZE
from engine.policy import CachePolicy
from engine.prefix_cache import model_dtype
from engine.window import WindowPolicy, make_window_cache


def policy_and_cache(loaded: Any, compute: ComputePath, kv_bits: int, prefill_chunk: int,
                     window: Any) -> tuple[CachePolicy, list[Any] | None]:
    """The checkpoint policy and live cache for `window` (None: `engine.kv` caches).

    8-bit KV always uses `engine.window`'s quantized cache, windowed or not:
    its prefill attends over dequantized slices with the fused kernel instead
    of mlx-lm's quantized attention. A window that cannot skip anything inside
    the model's context is exact attention.
    """
    context = getattr(loaded, "context_length", None)
    windowed = (window is not None and window.enabled
                and not (context and window.global_tokens + window.window_tokens >= context))
    policy = CachePolicy(model_id=str(getattr(loaded, "model_id", "")),
                         weight_hash=str(getattr(loaded, "weight_hash", "")),
                         dtype=model_dtype(compute.model), kv_bits=kv_bits,
                         kv_group_size=KV_GROUP_SIZE, prefill_chunk=prefill_chunk,
                         compute=compute.identity(),
                         **(window.cache_policy_fields() if windowed else {}))
    if not windowed and kv_bits == 16:
        return policy, None
    cache = make_window_cache(compute.model, window if windowed else WindowPolicy(enabled=False),
                              kv_bits, KV_GROUP_SIZE)
    return policy, cache
