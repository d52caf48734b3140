"""Warmth as the server shows and uses it: segment states, the prompt on the warm prefix."""
from __future__ import annotations

from engine.request import PromptSegment, stable_part
from server.core.warmth import on_warm_prefix, segment_states


def seg(kind: str, key: str, *ids: int) -> PromptSegment:
    return PromptSegment(kind, key, tuple(ids))


SYSTEM, A, B = seg("system", "system", 1, 2, 3), seg("file", "a.py", 4, 5), seg("file", "b.py", 6, 7, 8)
QUESTION = [seg("question", "question", 9), seg("header", "header", 10)]


def test_the_prefix_is_the_stable_part():
    assert stable_part([SYSTEM, A, *QUESTION]) == [SYSTEM, A]
    assert stable_part([SYSTEM, A, seg("hot", "a.py", 4, 6), *QUESTION]) == [SYSTEM, A, seg("hot", "a.py", 4, 6)]


def test_segment_states_follow_the_warm_tokens():
    assert segment_states([SYSTEM, A, B], 4) == ["cached", "partial", "cold"]
    assert segment_states([SYSTEM, A, B], 8) == ["cached", "cached", "cached"]
    assert segment_states([SYSTEM, A, B], 0) == ["cold", "cold", "cold"]


def test_edits_not_prefilled_yet_use_the_warm_prefix():
    assert on_warm_prefix([SYSTEM, A, *QUESTION], ()) == [SYSTEM, A, *QUESTION]  # nothing warm
    warm = (SYSTEM, A, B)
    current = [SYSTEM, A, B, *QUESTION]
    assert on_warm_prefix(current, warm) == current  # already the warm prefix
    edited = [SYSTEM, seg("file", "a.py", 4, 99), B, *QUESTION]
    assert on_warm_prefix(edited, warm) == [SYSTEM, A, B, *QUESTION]
    hot = [SYSTEM, A, B, seg("hot", "a.py", 4, 5, 6), *QUESTION]
    assert on_warm_prefix(hot, warm) == [SYSTEM, A, B, *QUESTION]
