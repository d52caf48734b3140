"""Checkpoints on a hybrid model (qwen3_next: Gated DeltaNet + attention layers).

The recurrent layers (mlx-lm `ArraysCache`) cannot be trimmed, so restore and
rollback must put back the snapshot taken at the boundary; a wrong snapshot
changes the answer, which these tests compare with a fresh engine's.
"""
from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache

from checkpoint_helpers import ask, cold, edit, prefix_len, repo_segments, restorable, run
from engine import state
from engine.engine import Engine
from engine.generate import prefill
from engine.kv import make_cache
from engine.loading import load_model
from engine.request import Request
from tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-next"), "qwen3_next")
    return load_model(str(path), progress=False)


@pytest.fixture(scope="module")
def repo(hybrid):
    return repo_segments(hybrid.tokenizer, n_files=4, file_tokens=12)


def test_the_tiny_hybrid_has_both_kinds_of_layers(hybrid):
    cache = make_cache(hybrid.model)
    assert any(isinstance(c, ArraysCache) for c in cache)
    assert any(not state.is_recurrent(c) for c in cache)


def test_snapshot_restore_equals_recompute(hybrid):
    model = hybrid.model
    ids = list(range(20, 60))
    cache = make_cache(model)
    prefill(model, cache, ids[:24], 8)
    snap = state.snapshot_recurrent(cache)
    assert snap and all(".rec." in k for k in snap)
    tail = prefill(model, cache, ids[24:], 8)
    # Roll back: trim attention, put the recurrent snapshot back, redo the tail.
    state.trim_to(cache, 24)
    state.restore_recurrent(cache, snap)
    again = prefill(model, cache, ids[24:], 8)
    assert mx.array_equal(tail, again)
    # Without the snapshot the recurrent layers would have seen the tail twice.
    state.trim_to(cache, 24)
    wrong = prefill(model, cache, ids[24:], 8)
    assert not mx.allclose(wrong, tail)


def test_warm_equals_cold_on_a_hybrid(hybrid, repo):
    tok = hybrid.tokenizer
    n = len(repo)
    mid = edit(repo, 2, repo[2].token_ids[:5] + tuple(tok.encode("y = 2\n")) + repo[2].token_ids[5:])
    last = edit(mid, n - 1, repo[n - 1].token_ids[:-2])
    continued = ask(tok, last, "More?", turns=("Why?", "Because."))
    steps = [(ask(tok, repo, "What?"), 0),
             (ask(tok, repo, "Why?"), prefix_len(repo, n)),
             (ask(tok, mid, "Now?"), prefix_len(repo, 2) + 5),
             (ask(tok, last, "Why?"), prefix_len(last, n)),
             (continued, prefix_len(continued, n + 1))]
    with Engine(hybrid, prefill_chunk=16) as warm:
        seen: set[str] = set()
        for segments, diverged_at in steps:
            tokens, done = run(warm, segments, max_tokens=6)
            assert done.metrics.cached_tokens == restorable(warm.prefix.store, segments, seen)
            assert done.metrics.cached_tokens > diverged_at - 16  # at most one grid step lost
            assert tokens == cold(hybrid, segments, max_tokens=6)


def test_cancel_rolls_back_recurrent_state(hybrid, repo):
    segments = ask(hybrid.tokenizer, repo, "Stop?")
    with Engine(hybrid, prefill_chunk=4) as eng:
        request = Request(segments=segments, max_tokens=4)
        stop_at = prefix_len(segments, 2) + 4

        def cancel(done, total):
            if done == stop_at:
                eng.cancel(request.request_id)

        events = list(eng.submit(request, on_progress=cancel))
        assert events[-1].finish_reason == "cancelled"
        assert eng.prefix.store.line_offset == stop_at
        line_snapshot = eng.prefix.store.checkpoints()[-1].recurrent
        for key, arr in state.snapshot_recurrent(eng.prefix.cache).items():
            assert arr is line_snapshot[key]
        tokens, done = run(eng, segments, max_tokens=6)
    assert done.metrics.cached_tokens == stop_at
    assert tokens == cold(hybrid, segments, max_tokens=6)


def test_hybrid_checkpoints_count_their_snapshots(hybrid, repo):
    with Engine(hybrid, prefill_chunk=16) as eng:
        run(eng, ask(hybrid.tokenizer, repo, "Size?"), max_tokens=1)
        assert eng.wait_idle(60)  # the worker's work between requests done: it copies the one-off tail ahead
        cps = eng.prefix.store.checkpoints()
        per_snapshot = sum(x.nbytes for c in eng.prefix.cache if state.is_recurrent(c)
                           for x in c.cache if x is not None)
        assert per_snapshot > 0
        marks = [c for c in cps if c.kv is None]
        assert marks and all(c.nbytes == per_snapshot for c in marks)  # marks: snapshot only
        tails = [c for c in cps if c.kv is not None]  # the one-off tail, copied ahead
        assert tails and all(c.nbytes == per_snapshot + state.nbytes(c.kv) for c in tails)
        assert eng.prefix.store.nbytes == sum(c.nbytes for c in cps)


def test_hybrid_archive_restart(hybrid, repo, tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    segments = ask(hybrid.tokenizer, repo, "Again?")
    with Engine(hybrid, prefill_chunk=16, archive_bytes=16 << 20) as first:
        run(first, segments, max_tokens=6)
    with Engine(hybrid, prefill_chunk=16, archive_bytes=16 << 20) as second:
        tokens, done = run(second, segments, max_tokens=6)
    assert done.metrics.cached_tokens == prefix_len(segments, len(repo))
    assert tokens == cold(hybrid, segments, max_tokens=6)
