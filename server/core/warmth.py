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
        self.segments: tuple[PromptSegment, ...] = ()

    def record(self, segments: Sequence[PromptSegment]) -> None:
        """Notes that `segments`' prefix part is now in the engine's checkpoints."""
        self.segments = tuple(prefix_part(segments))

    def common_segments(self, segments: Sequence[PromptSegment]) -> int:
        """How many leading segments of `segments` equal the record."""
        count = 0
        for segment, recorded in zip(segments, self.segments):
            if (segment.kind, segment.key, tuple(segment.token_ids)) != (
                    recorded.kind, recorded.key, tuple(recorded.token_ids)):
                break
            count += 1
        return count

    def on_warm_prefix(self, segments: Sequence[PromptSegment], recorded_warm: bool) -> list[PromptSegment]:
        """`segments` with their prefix replaced by the recorded (warm) one, when that helps.

        While edits are not prefilled yet, the last prefilled prefix (the
        repository as the model last read it) plus this request's own segments
        costs only the request. Used only when the backend still holds the
        recorded prefix (`recorded_warm`); otherwise `segments` as given.
        """
        prefix = prefix_part(segments)
        if not self.segments or (len(prefix) == len(self.segments) == self.common_segments(prefix)):
            return list(segments)
        if not recorded_warm:
            return list(segments)
        return list(self.segments) + list(segments[len(prefix):])

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
