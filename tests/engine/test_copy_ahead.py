"""The line's one-off tail (a question, its header, an answer) is copied out between requests, not on the next
request's path: `CheckpointStore.copy_ahead`, run by the engine's worker while no request waits.

A new question or an edit leaves that tail; copying it then took 7-11 ms of a 131k-token ask on the H200 (8-bit KV).
"""
from __future__ import annotations

import logging

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from checkpoint_helpers import ask, cold, prefix_len, repo_segments, run
from engine import state
from engine.checkpoints import CheckpointStore
from engine.engine import Engine
from engine.request import PromptSegment

HEADS, DIM = 2, 8
FILES = [PromptSegment("file", "a", (1, 2, 3, 4)), PromptSegment("file", "b", (5, 6, 7, 8))]


def _layout(question: tuple[int, ...]) -> list[PromptSegment]:
    return [*FILES, PromptSegment("question", "q", question), PromptSegment("header", "h", (90, 91), protected=True)]


def _prefill(store: CheckpointStore, cache: list[KVCache], segments: list[PromptSegment], seed: int) -> None:
    """Grow `cache` past its line with random rows for each boundary left, recording each."""
    for b in store.boundaries(segments):
        if b.end <= store.line_offset:
            continue
        n = b.end - b.start
        for i, c in enumerate(cache):
            rows = [mx.random.normal((1, HEADS, n, DIM), key=mx.random.key(seed + b.start + 100 * i + k)) for k in (0, 1)]
            c.update_and_fetch(*rows)
        store.record(cache, b)


def _counting(monkeypatch) -> list[tuple[int, int]]:
    copies: list[tuple[int, int]] = []
    copy = state.copy_kv_span
    monkeypatch.setattr(state, "copy_kv_span", lambda cache, s, e: copies.append((s, e)) or copy(cache, s, e))
    return copies


def test_the_tail_copied_ahead_is_what_the_next_request_detaches_and_restores_byte_for_byte(monkeypatch):
    store, cache = CheckpointStore("pol", 1 << 20), [KVCache() for _ in range(2)]
    first = _layout((10, 11, 12))
    _prefill(store, cache, first, seed=0)
    end = store.line_offset
    rows = [mx.array(c.keys[..., :end, :]) for c in cache]
    copies = _counting(monkeypatch)
    assert store.copy_ahead(cache) == 0
    tail = [cp for cp in store.checkpoints() if not cp.boundary.kind.archived]
    assert tail and copies == [(cp.boundary.start, cp.boundary.end) for cp in reversed(tail)]  # newest first
    assert all(cp.kv is not None for cp in tail)
    assert all(cp.kv is None for cp in store.checkpoints() if cp.boundary.kind.archived)  # the files stay marks
    assert store.copy_ahead(cache) == 0 and len(copies) == len(tail)  # nothing copied twice

    second = _layout((20, 21, 22))  # a new question leaves the tail: no copy on its path
    store.restore(cache, store.plan(store.boundaries(second), 10**6))
    assert len(copies) == len(tail) and store.line_offset == prefix_len(second, 2)
    _prefill(store, cache, second, seed=500)

    back = store.plan(store.boundaries(first), 10**6)  # back to the first tail, restored from its copy
    assert back.offset == end
    store.restore(cache, back)
    assert all(mx.array_equal(c.keys[..., :end, :], r).item() for c, r in zip(cache, rows))


def test_copying_ahead_stops_when_told_and_leaves_a_tail_too_long_to_detach():
    store, cache = CheckpointStore("pol", 1 << 20), [KVCache() for _ in range(2)]
    _prefill(store, cache, _layout((10, 11, 12)), seed=0)
    tail = [cp for cp in store.checkpoints() if not cp.boundary.kind.archived]
    assert store.copy_ahead(cache, stop=lambda: True) == len(tail)
    assert all(cp.kv is None for cp in tail)

    short = CheckpointStore("pol", 1 << 20, max_branch_tokens=2)  # the tail is 5 tokens: leaving drops it
    other = [KVCache() for _ in range(2)]
    _prefill(short, other, _layout((10, 11, 12)), seed=0)
    assert short.copy_ahead(other) == 0
    assert all(cp.kv is None for cp in short.checkpoints())


def test_the_engine_copies_the_tail_between_requests_and_answers_as_a_cold_engine(tiny_loaded, caplog):
    tok = tiny_loaded.tokenizer
    repo = repo_segments(tok)
    hover, question = ask(tok, repo, "hover: f3"), ask(tok, repo, "ask: why?")
    continued = [*hover, PromptSegment("answer", "a", tuple(tok.encode(" It returns")))]
    with Engine(tiny_loaded, prefill_chunk=16) as eng:
        run(eng, hover)
        assert eng.wait_idle(60)
        line_tail = [cp for cp in eng.prefix.store.checkpoints() if cp.boundary.end > prefix_len(hover, len(repo))]
        assert line_tail and all(cp.kv is not None for cp in line_tail)
        listed = eng.prefix.stats()["checkpoint_list"]
        assert listed and not any(c["branch"] for c in listed)  # copied ahead, still on the line
        assert sum(c["bytes"] for c in listed) == eng.prefix.stats()["checkpoint_bytes"] > 0  # stats refreshed
        with caplog.at_level(logging.DEBUG, logger="engine.checkpoints"):
            asked, _ = run(eng, question)
        assert not [r for r in caplog.records if hasattr(r, "detach")]  # nothing copied on the question's path
        branches = [c for c in eng.prefix.stats()["checkpoint_list"] if c["branch"]]
        assert branches and all(c["end"] > prefix_len(hover, len(repo)) for c in branches)  # the hover's tail left
        tokens, done = run(eng, continued)  # the hover's tail restored from the copy made ahead
        assert done.metrics.cached_tokens == prefix_len(hover, len(hover))
    assert asked == cold(tiny_loaded, question)
    assert tokens == cold(tiny_loaded, continued)


def _row_bytes(cache: list[KVCache]) -> int:
    """Bytes one token's keys and values take in `cache` (what a copied checkpoint owns per token)."""
    return sum(2 * c.keys[..., :1, :].nbytes for c in cache)


def test_a_copy_made_ahead_never_costs_a_checkpoint_and_the_budget_releases_such_copies_first():
    cache = [KVCache() for _ in range(2)]
    probe = CheckpointStore("pol", 1 << 20)
    _prefill(probe, cache, _layout((10, 11, 12)), seed=0)
    row = _row_bytes(cache)

    store, cache = CheckpointStore("pol", 3 * row), [KVCache() for _ in range(2)]  # less than the 5-token tail
    _prefill(store, cache, _layout((10, 11, 12)), seed=0)
    line = [cp.boundary.end for cp in store.checkpoints()]
    assert store.copy_ahead(cache) == 0
    assert [cp.boundary.end for cp in store.checkpoints()] == line and store.line_offset == line[-1]
    assert all(cp.kv is None for cp in store.checkpoints()) and store.nbytes == 0  # the copy was not kept

    store, cache = CheckpointStore("pol", 1 << 20), [KVCache() for _ in range(2)]
    first = _layout((10, 11, 12))
    _prefill(store, cache, first, seed=0)
    second = _layout((20, 21, 22))
    store.restore(cache, store.plan(store.boundaries(second), 10**6))  # the first tail detached: a branch
    _prefill(store, cache, second, seed=500)
    branch = [cp for cp in store.checkpoints() if cp.kv is not None]
    store.copy_ahead(cache)
    ahead = [cp for cp in store.checkpoints() if cp.kv is not None and cp not in branch]
    assert branch and ahead
    store.set_budget(sum(cp.nbytes for cp in branch))  # room for the branch alone: the copies made ahead go
    assert all(cp.kv is None for cp in ahead) and all(cp.kv is not None for cp in branch)
    assert store.plan(store.boundaries(first), 10**6).offset == prefix_len(first, 4)


def test_copies_further_down_the_line_are_released_once_the_line_goes_on():
    store, cache = CheckpointStore("pol", 1 << 20), [KVCache() for _ in range(2)]
    first = _layout((10, 11, 12))
    _prefill(store, cache, first, seed=0)
    store.copy_ahead(cache)
    copied = [cp for cp in store.checkpoints() if cp.kv is not None]
    assert copied
    _prefill(store, cache, [*first, PromptSegment("turn", "t", (30, 31))], seed=900)  # a turn (archived kind) after
    assert store.copy_ahead(cache) == 0
    assert all(cp.kv is None for cp in store.checkpoints()) and store.nbytes == 0
