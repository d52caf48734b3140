"""How warm the prompt is, as the server shows and uses it; the engine's answers, never a copy.

What the engine holds comes from `Backend.probe` (how much of a prompt is warm)
and `Backend.warm_prefix` (the repository prefix it last prefilled, while held).
"""
from __future__ import annotations

from typing import Sequence

from engine.request import SegmentLike, stable_part


def segment_states(segments: Sequence[SegmentLike], warm_tokens: int) -> list[str]:
    """"cached", "partial" or "cold" for each segment, given the warm token count."""
    states, start = [], 0
    for segment in segments:
        end = start + len(segment.token_ids)
        states.append("cached" if end <= warm_tokens else "partial" if start < warm_tokens else "cold")
        start = end
    return states


def on_warm_prefix(segments: Sequence[SegmentLike], warm: Sequence[SegmentLike]) -> list[SegmentLike]:
    """`segments` with their repository prefix replaced by `warm` when the two differ.

    While edits are not prefilled yet, the prefix the engine last prefilled and
    still holds (the repository as the model last read it) plus this request's
    own segments costs only the request. Without a warm prefix, or when it is
    the prefix of `segments` already, `segments` as given.
    """
    prefix = stable_part(segments)
    if not warm or _same(prefix, warm):
        return list(segments)
    return [*warm, *segments[len(prefix):]]


def _same(a: Sequence[SegmentLike], b: Sequence[SegmentLike]) -> bool:
    return len(a) == len(b) and all((x.kind, x.key, tuple(x.token_ids)) == (y.kind, y.key, tuple(y.token_ids))
                                    for x, y in zip(a, b))
