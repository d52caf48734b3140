"""How much of the stable prefix the engine holds: the server's record of what it prefilled.

The engine keeps checkpoints; the server remembers the prefix segments its last
finished request prefilled. The warm part of the current prefix is the run of
leading segments equal to that record, cut back to the last engine checkpoint
inside it (so evicted state is not counted as warm).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from engine.request import PromptSegment

QUESTION_KINDS = frozenset({"turn", "question", "header"})
"""Segment kinds after the prefix: what one request adds and the next one replaces."""


def prefix_part(segments: Sequence[PromptSegment]) -> list[PromptSegment]:
    """The leading segments before the first turn/question/header segment."""
    part = []
    for segment in segments:
        if segment.kind in QUESTION_KINDS:
            break
        part.append(segment)
    return part


class PrefixRecord:
    """The prefix segments of the last request that finished its prefill."""

    def __init__(self) -> None:
        self._segments: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

    def record(self, segments: Sequence[PromptSegment]) -> None:
        """Notes that `segments`' prefix part is now in the engine's checkpoints."""
        self._segments = tuple((s.kind, s.key, tuple(s.token_ids)) for s in prefix_part(segments))

    def common_segments(self, segments: Sequence[PromptSegment]) -> int:
        """How many leading segments of `segments` equal the record."""
        count = 0
        for segment, recorded in zip(segments, self._segments):
            if (segment.kind, segment.key, tuple(segment.token_ids)) != recorded:
                break
            count += 1
        return count

    def without_cold_tail(self, segments: Sequence[PromptSegment]) -> list[PromptSegment]:
        """`segments` minus the hot-tail segments not prefilled yet, when those are all that is cold.

        An edited file's old copy keeps its place in the prefix and its new text
        joins the hot tail; leaving that new text out until warm-up has prefilled
        it makes a request cost only its question. Any other cold segment (the
        prefix itself changed) keeps the prompt whole.
        """
        prefix = prefix_part(segments)
        warm = self.common_segments(prefix)
        cold = prefix[warm:]
        if not cold or any(s.kind != "hot" for s in cold):
            return list(segments)
        return prefix[:warm] + list(segments[len(prefix):])

    def warm_tokens(self, segments: Sequence[PromptSegment], checkpoint_ends: Iterable[int] | None = None) -> int:
        """Tokens of `segments` the engine can restore instead of recomputing.

        Args:
            segments: The current prefix.
            checkpoint_ends: End positions of the engine's checkpoints; the warm
                part is cut back to the last one inside it. None skips the check.
        """
        common = sum(len(s.token_ids) for s in segments[: self.common_segments(segments)])
        if checkpoint_ends is None:
            return common
        return max((end for end in checkpoint_ends if end <= common), default=0)


def segment_states(segments: Sequence[PromptSegment], warm_tokens: int) -> list[str]:
    """"cached", "partial" or "cold" for each segment, given the warm token count."""
    states, start = [], 0
    for segment in segments:
        end = start + len(segment.token_ids)
        states.append("cached" if end <= warm_tokens else "partial" if start < warm_tokens else "cold")
        start = end
    return states
