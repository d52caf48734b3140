"""The archive's copies are made late: between requests, or just before the live line overwrites their rows.

Recording a checkpoint used to copy its span for the archive at once, between a request's forwards (on the H200,
5-22 ms, median 13, for a 2,048-row checkpoint of an 8-bit cache: 0.82 s of a 131k-token cold ask, run q).
`CheckpointStore.settle` makes the copies instead, and `restore` and `rollback` settle whatever they are about to
overwrite first.
"""
from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from checkpoint_helpers import ask, repo_segments, run
from engine import state
from engine.archive import CheckpointArchive
from engine.boundaries import boundaries
from engine.checkpoint_types import Plan
from engine.checkpoints import CheckpointStore
from engine.engine import Engine
from engine.request import PromptSegment

HEADS, DIM = 2, 8


def _rows(seed: int, n: int) -> mx.array:
    return mx.random.normal((1, HEADS, n, DIM), key=mx.random.key(seed))


def _grow(cache: list[KVCache], seed: int, n: int) -> None:
    for i, c in enumerate(cache):
        c.update_and_fetch(_rows(seed + i, n), _rows(seed + 10 + i, n))


def _recorded(store: CheckpointStore) -> tuple[list[KVCache], list]:
    """A live cache of two layers holding three files of four tokens, each recorded as it was prefilled."""
    cache = [KVCache() for _ in range(2)]
    checkpoints = []
    for i, b in enumerate(_three_files()):
        _grow(cache, 20 * i, 4)
        checkpoints.append(store.record(cache, b))
    return cache, checkpoints


def _three_files() -> list:
    return boundaries("pol", [PromptSegment("file", name, tuple(range(4 * i, 4 * i + 4)))
                              for i, name in enumerate("abc")])


def _keys(cache: list[KVCache], start: int, end: int) -> list[mx.array]:
    return [mx.array(c.keys[..., start:end, :]) for c in cache]


def test_a_recorded_checkpoint_is_copied_for_the_archive_when_settled_not_when_recorded(tmp_path, monkeypatch):
    copies: list[tuple[int, int]] = []
    copy = state.copy_kv_span
    monkeypatch.setattr(state, "copy_kv_span", lambda cache, s, e: copies.append((s, e)) or copy(cache, s, e))
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    store = CheckpointStore("pol", 1 << 20, archive=archive)
    cache, _ = _recorded(store)
    assert copies == []
    stops = iter([False, True])
    assert store.settle(cache, stop=lambda: next(stops)) == 2  # one made, then told to stop
    assert copies == [(8, 12)]  # newest first: the tail a later edit overwrites first
    assert store.settle(cache) == 0 and copies == [(8, 12), (4, 8), (0, 4)]
    assert store.settle(cache) == 0 and len(copies) == 3  # nothing owed twice
    archive.flush()
    for b in _three_files():
        kv, _ = archive.load(archive.get(b.key))
        assert mx.array_equal(kv["0.kv.0"], _keys(cache, b.start, b.end)[0])


def test_a_restore_that_leaves_the_line_settles_the_rows_it_overwrites_first(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    store = CheckpointStore("pol", 1 << 20, archive=archive)
    cache, checkpoints = _recorded(store)
    bounds = _three_files()
    before = _keys(cache, 4, 12)
    offset, _ = store.restore(cache, Plan(path=checkpoints[:1], archived=[], miss=None))  # an edit of file b
    _grow(cache, 50, 8)  # the edited rows where files b and c were
    assert offset == 4 and not mx.array_equal(_keys(cache, 4, 12)[0], before[0])
    assert store.settle(cache, stop=lambda: True) == 1  # the restore settled only what it overwrote: a owed
    archive.flush()
    for b, (start, end) in zip(bounds[1:], ((4, 8), (8, 12))):
        kv, _ = archive.load(archive.get(b.key))
        assert mx.array_equal(kv["0.kv.0"], before[0][..., start - 4:end - 4, :])
        assert mx.array_equal(kv["1.kv.0"], before[1][..., start - 4:end - 4, :])


def test_a_rollback_trims_only_unconfirmed_rows_and_leaves_the_copies_owed(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    store = CheckpointStore("pol", 1 << 20, archive=archive)
    cache, _ = _recorded(store)
    _grow(cache, 90, 2)  # two tokens past the last boundary: unconfirmed
    assert store.rollback(cache) == 12 and state.attention_offset(cache) == 12
    assert store.settle(cache, above=12) == 3  # nothing of the line was trimmed: all three still owed
    store.forget_owed()
    assert store.settle(cache) == 0
    archive.flush()
    assert len(archive) == 0


def test_a_rollback_below_an_evicted_checkpoint_copies_its_rows_before_trimming_them(tmp_path):
    """Evicting a checkpoint of the line shortens the line, so a rollback trims rows a checkpoint still owes the
    archive: it copies them first, and the archive holds the rows as they were, not what was written after."""
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    store = CheckpointStore("pol", 1 << 20, archive=archive)
    cache, checkpoints = _recorded(store)
    before = _keys(cache, 4, 8)
    store._drop(checkpoints[1])  # eviction, as a tight budget does: b and c leave the line
    assert store.line_offset == 4
    _grow(cache, 90, 2)
    assert store.rollback(cache) == 4
    _grow(cache, 70, 8)  # a later request's rows where b and c were
    store.settle(cache)
    archive.flush()
    kv, _ = archive.load(archive.get(checkpoints[1].boundary.key))
    assert mx.array_equal(kv["0.kv.0"], before[0]) and mx.array_equal(kv["1.kv.0"], before[1])


def test_a_copy_that_fails_is_skipped_and_the_others_are_still_made(tmp_path, monkeypatch, caplog):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    store = CheckpointStore("pol", 1 << 20, archive=archive)
    cache, checkpoints = _recorded(store)
    copy = state.copy_kv_span

    def failing(cache, start, end):
        if start == 4:
            raise MemoryError("out of device memory")
        return copy(cache, start, end)

    monkeypatch.setattr(state, "copy_kv_span", failing)
    assert store.settle(cache) == 0
    archive.flush()
    assert [archive.get(cp.boundary.key) is not None for cp in checkpoints] == [True, False, True]
    assert "out of device memory" in caplog.text


def test_the_engine_copies_checkpoints_for_the_archive_between_requests_and_before_it_closes(
        tmp_path, monkeypatch, tiny_loaded):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    inside: list[bool] = []
    copy = state.copy_kv_span

    def watched(cache, start, end):
        inside.append(not engine.prefix.archive._may_write.is_set())  # cleared while a request runs
        return copy(cache, start, end)

    monkeypatch.setattr(state, "copy_kv_span", watched)
    layout = ask(tiny_loaded.tokenizer, repo_segments(tiny_loaded.tokenizer), "Where is main?")
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=64 << 20) as engine:
        run(engine, layout)
    archived = [b for b in engine.prefix.store.boundaries(layout) if b.kind.archived]
    assert len(inside) == len(archived) > 0 and not any(inside)
    assert len(engine.prefix.archive) == len(archived)  # all written by the time the engine closed


def test_the_benchmarks_log_reader_collects_the_archives_copies(tmp_path):
    """`bench/request_profile.ForwardLog` (what `bench/gpu_engine.py` rows carry as `archive_copies`)."""
    from bench.request_profile import ForwardLog

    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    store = CheckpointStore("pol", 1 << 20, archive=archive)
    cache, _ = _recorded(store)
    with ForwardLog() as log:
        store.settle(cache, stop=iter([False, True]).__next__)
        store.settle(cache)
    assert [count for count, _ in log.archive_copies] == [1, 2]
    assert all(seconds >= 0 for _, seconds in log.archive_copies)
    archive.close()


def test_the_engine_is_idle_only_once_no_request_waits_and_the_archive_is_owed_nothing(
        tmp_path, monkeypatch, tiny_loaded):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    layout = ask(tiny_loaded.tokenizer, repo_segments(tiny_loaded.tokenizer), "Where is main?")
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=64 << 20) as engine:
        assert engine.wait_idle(timeout=0)  # nothing submitted yet
        during: list[bool] = []
        run(engine, layout, on_progress=lambda *_: during.append(engine.wait_idle(timeout=0)))
        assert during and not any(during)
        assert engine.wait_idle(timeout=60)
        assert engine.prefix.store.settle(engine.prefix.cache, stop=lambda: True) == 0  # all copied, none owed
        engine.prefix.archive.flush()  # the writer thread writes what the worker handed it
        assert len(engine.prefix.archive) == len([b for b in engine.prefix.store.boundaries(layout)
                                                  if b.kind.archived])


def test_the_queue_is_idle_only_when_marked_with_nothing_queued():
    from engine.jobs import JobQueue
    from engine.request import Request

    jobs = JobQueue()
    assert jobs.idle.is_set()
    jobs.put(jobs.new_job(Request(prompt_ids=[1, 2], max_tokens=1), None, None))
    assert not jobs.idle.is_set()
    jobs.mark_idle()
    assert not jobs.idle.is_set()  # a job is still queued
    assert jobs.get() is not None and jobs.empty()
    jobs.mark_idle()
    assert jobs.idle.is_set()
