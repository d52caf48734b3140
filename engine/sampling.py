"""Choosing the next token from logits: greedy, or temperature + top-p with a seeded key."""
from __future__ import annotations

from typing import Callable

import mlx.core as mx

from .request import SamplingParams

Sampler = Callable[[mx.array], mx.array]
"""Maps logits of shape (1, vocab) to the chosen token ids, shape (1,)."""


def greedy(logits: mx.array) -> mx.array:
    """The most likely token (ties go to the lowest id)."""
    return mx.argmax(logits, axis=-1)


def top_p_filter(logits: mx.array, top_p: float) -> mx.array:
    """Mask every token outside the smallest set whose probability mass reaches `top_p`.

    The most likely token always survives, so `top_p` near 0 degenerates to greedy.
    """
    order = mx.argsort(-logits, axis=-1)
    sorted_logits = mx.take_along_axis(logits, order, axis=-1)
    probs = mx.softmax(sorted_logits, axis=-1)
    mass_before = mx.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < top_p
    # Scatter the keep flags back to vocabulary order.
    keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
    return mx.where(keep, logits, -mx.inf)


def make_sampler(params: SamplingParams) -> Sampler:
    """Build the sampler for one request.

    Args:
        params: temperature 0 means greedy; otherwise logits are divided by the
            temperature, filtered to `top_p` mass, and sampled with a key derived
            from `params.seed` (a fresh random seed when None), so a seeded
            request gives the same tokens every time.

    Returns:
        A function from logits (1, vocab) to token ids (1,).

    Raises:
        ValueError: For a negative temperature or top_p outside (0, 1].
    """
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.temperature == 0:
        return greedy

    seed = params.seed if params.seed is not None else int(mx.random.randint(0, 2**31 - 1).item())
    key = mx.random.key(seed)

    def sample(logits: mx.array) -> mx.array:
        nonlocal key
        key, sub = mx.random.split(key)
        scaled = logits.astype(mx.float32) / params.temperature
        if params.top_p < 1:
            scaled = top_p_filter(scaled, params.top_p)
        return mx.random.categorical(scaled, axis=-1, key=sub)

    return sample
