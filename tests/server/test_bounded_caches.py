"""The server's per-session caches stay bounded however many keys a client sends."""
from __future__ import annotations

from server.core.prompt import Conversations
from server.core.features.hover import MAX_ANSWERS, HoverCache


def test_conversations_keep_the_most_recent_ones():
    conversations = Conversations(capacity=3)
    ids = [conversations.get(f"client-{i}")[0] for i in range(10)]
    assert ids == [f"client-{i}" for i in range(10)]
    assert len(conversations._turns) == 3
    _, turns = conversations.get("client-9")
    turns.append("kept")
    assert conversations.get("client-9")[1] == ["kept"]  # the same conversation, not a new one
    assert conversations.get("client-0")[1] == []  # forgotten: starts over


def test_hover_answers_are_bounded():
    cache = HoverCache(read_text=lambda path: "")
    for i in range(MAX_ANSWERS + 100):
        cache.answers[(f"definition-{i}", "deps")] = "an answer"
    assert len(cache.answers) == MAX_ANSWERS
    assert ("definition-0", "deps") not in cache.answers and (f"definition-{MAX_ANSWERS + 99}", "deps") in cache.answers
