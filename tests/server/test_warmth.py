"""The server's record of the prefilled prefix: warm tokens, segment states, the cold hot tail."""
from __future__ import annotations

from engine.request import PromptSegment
from server.core.warmth import PrefixRecord, prefix_part, segment_states


def seg(kind: str, key: str, *ids: int) -> PromptSegment:
    return PromptSegment(kind, key, tuple(ids))


SYSTEM, A, B = seg("system", "system", 1, 2, 3), seg("file", "a.py", 4, 5), seg("file", "b.py", 6, 7, 8)
QUESTION = [seg("question", "question", 9), seg("header", "header", 10)]


def test_prefix_part_stops_at_the_question():
    assert prefix_part([SYSTEM, A, *QUESTION]) == [SYSTEM, A]


def test_warm_tokens_follow_the_record_and_the_checkpoints():
    record = PrefixRecord()
    assert record.warm_tokens([SYSTEM, A, B]) == 0
    record.record([SYSTEM, A, B, *QUESTION])
    assert record.warm_tokens([SYSTEM, A, B]) == 8
    assert record.warm_tokens([SYSTEM, seg("file", "a.py", 4, 99), B]) == 3  # a.py changed
    assert record.warm_tokens([SYSTEM, A, B], checkpoint_ends=[4, 6]) == 6  # 8 was evicted
    assert segment_states([SYSTEM, A, B], 4) == ["cached", "partial", "cold"]


def test_edits_not_prefilled_yet_use_the_recorded_prefix():
    record = PrefixRecord()
    assert record.on_warm_prefix([SYSTEM, A, *QUESTION], True) == [SYSTEM, A, *QUESTION]  # nothing recorded
    record.record([SYSTEM, A, B, *QUESTION])
    current = [SYSTEM, A, B, *QUESTION]
    assert record.on_warm_prefix(current, True) == current  # already warm
    edited = [SYSTEM, seg("file", "a.py", 4, 99), B, *QUESTION]
    assert record.on_warm_prefix(edited, True) == [SYSTEM, A, B, *QUESTION]
    hot = [SYSTEM, A, B, seg("hot", "a.py", 4, 5, 6), *QUESTION]
    assert record.on_warm_prefix(hot, True) == [SYSTEM, A, B, *QUESTION]
    # When the backend no longer holds the recorded prefix (evicted) the prompt stays as given.
    assert record.on_warm_prefix(edited, False) == edited
