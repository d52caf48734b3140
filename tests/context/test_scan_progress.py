"""A build's progress: every file parsed and every uncounted one tokenized is reported, in
batches a progress callback can stop (Ctrl-C in `codectx ask`, a shutdown in the server)."""
from __future__ import annotations

import pytest

import fixture_repo
from context.errors import ScanStopped
from context.tokencache import TokenCache
from context.workspace import Workspace


def test_a_build_reports_parsing_then_tokenizing(repo, smol_tokenizer, monkeypatch):
    monkeypatch.setattr("context.tokencache.COUNT_BATCH_CHARS", 300)  # several batches on the fixture
    reports: list[tuple[str, int, int]] = []
    ws = Workspace(repo, smol_tokenizer, budget=600, progress=lambda *report: reports.append(report))
    layout = ws.build()
    files = len(layout.rows)
    parsing = [r for r in reports if r[0] == "parsing"]
    assert parsing == [("parsing", n, files) for n in range(1, files + 1)]
    tokenizing = [r for r in reports if r[0] == "tokenizing"]
    assert len(tokenizing) > 2 and tokenizing[-1] == ("tokenizing", files, files)
    assert [done for _, done, _ in tokenizing] == sorted({done for _, done, _ in tokenizing})
    assert reports.index(parsing[-1]) < reports.index(tokenizing[0])

    again: list[tuple[str, int, int]] = []  # a second process: every count is cached
    Workspace(repo, smol_tokenizer, budget=600, progress=lambda *report: again.append(report)).build()
    assert {stage for stage, _, _ in again} == {"parsing"}


def test_progress_that_raises_stops_the_build_and_saves_nothing(repo, smol_tokenizer):
    def stop_at_third(stage: str, done: int, total: int) -> None:
        if done == 3:
            raise ScanStopped

    ws = Workspace(repo, smol_tokenizer, budget=600, progress=stop_at_third)
    with pytest.raises(ScanStopped):
        ws.build()
    assert not ws._state_path.exists()
    assert ws.layout.segments == ()
    assert Workspace(repo, smol_tokenizer, budget=600).build().segments  # nothing half-written is read back


def test_batched_counts_equal_one_batch(repo, smol_tokenizer, monkeypatch):
    texts = [*fixture_repo.FILES.values(), "value = compute(1)\n" * 60]  # the last: 1,140 characters, over a batch
    whole = TokenCache(smol_tokenizer, persist=False).count_chunked(texts)
    monkeypatch.setattr("context.tokencache.COUNT_BATCH_CHARS", 150)
    seen: list[tuple[int, int]] = []
    cache = TokenCache(smol_tokenizer, persist=False)
    assert cache.count_chunked(texts, progress=lambda done, total: seen.append((done, total))) == whole
    assert whole == [len(ids) for ids in cache.encode_chunked(texts)]
    assert len(seen) > 3 and seen[-1] == (len(texts), len(texts))
