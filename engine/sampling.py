"""Choosing the next token from logits: greedy, or temperature + top-p with a seeded key,
after an optional repetition penalty."""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

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


class RepetitionPenalty:
    """Makes the tokens a request already generated less likely (CTRL's rule).

    Every distinct token of the request's output so far (the answer, not the
    prompt: the prompt is a whole repository) has its logit divided by
    `penalty` when positive and multiplied by it when negative, before the
    sampler (greedy or temperature) sees the logits. Speculative verification
    applies it row by row, each row with the drafts before it counted, so a
    greedy speculative output equals the plain one.

    Args:
        penalty: > 0; 1.0 changes nothing (`of` then gives None: no work at all).

    Raises:
        ValueError: For a penalty that is not a positive finite number.
    """

    def __init__(self, penalty: float) -> None:
        if not 0 < penalty < float("inf"):
            raise ValueError(f"repetition_penalty must be a positive number, got {penalty}")
        self.penalty = float(penalty)
        self.seen: set[int] = set()

    @classmethod
    def of(cls, params: SamplingParams) -> RepetitionPenalty | None:
        """The request's penalty, or None when it is off (1.0)."""
        return None if params.repetition_penalty == 1.0 else cls(params.repetition_penalty)

    def observe(self, tokens: Iterable[int]) -> None:
        """Counts generated tokens as seen."""
        self.seen.update(int(t) for t in tokens)

    def apply(self, logits: mx.array, extra: Iterable[int] = ()) -> mx.array:
        """`logits` (..., vocab) with the seen tokens (and `extra`) penalized."""
        ids = sorted(self.seen.union(extra))
        if not ids:
            return logits
        index = mx.array(ids, dtype=mx.uint32)
        picked = mx.take(logits, index, axis=-1)
        scaled = mx.where(picked > 0, picked / self.penalty, picked * self.penalty)
        return mx.put_along_axis(logits, mx.broadcast_to(index, picked.shape), scaled, axis=-1)

    def apply_rows(self, logits: mx.array, drafts: Sequence[int]) -> mx.array:
        """Verification logits (L, vocab): row i penalized as if drafts[:i] were generated."""
        rows = [self.apply(logits[i:i + 1], drafts[:i]) for i in range(logits.shape[0])]
        return mx.concatenate(rows, axis=0)
