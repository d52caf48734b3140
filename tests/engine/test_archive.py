"""The disk archive: round trip, restart warm start, corrupt/truncated/foreign entries, cap."""
from __future__ import annotations

import mlx.core as mx
import msgpack
import pytest

from checkpoint_helpers import ask, cold, prefix_len, repo_segments, run
from engine.archive import INDEX_NAME, ArchiveCorruptError, CheckpointArchive
from engine.checkpoints import boundaries
from engine.engine import Engine
from engine.request import PromptSegment

ARCHIVE_BYTES = 64 << 20


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def layout(tiny_loaded):
    return ask(tiny_loaded.tokenizer, repo_segments(tiny_loaded.tokenizer), "Where is main?")


def _bound(i: int, parent_tokens: tuple[int, ...] = ()):
    segs = [PromptSegment("file", "a", parent_tokens or (1, 2, 3)), PromptSegment("file", "b", (i, i + 1))]
    return boundaries("pol", segs)


def _arrays(seed: int):
    mx.random.seed(seed)
    return {"1.kv.0": mx.random.normal((1, 1, 2, 8)), "1.kv.1": mx.random.normal((1, 1, 2, 8))}, \
        {"0.rec.0": mx.random.normal((1, 3, 4))}


def test_round_trip_and_reopen(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    b = _bound(5)[1]
    kv, rec = _arrays(0)
    archive.submit(b, kv, rec)
    archive.close()
    reopened = CheckpointArchive("pol", 1 << 20, tmp_path)
    entry = reopened.get(b.key)
    assert entry is not None and entry.matches(b) and len(reopened) == 1
    kv2, rec2 = reopened.load(entry)
    assert set(kv2) == set(kv) and all(mx.array_equal(kv[k], kv2[k]) for k in kv)
    assert mx.array_equal(rec["0.rec.0"], rec2["0.rec.0"])
    assert reopened.nbytes == (tmp_path / "pol" / f"{b.key}.safetensors").stat().st_size
    assert not list((tmp_path / "pol").glob(".*tmp*"))  # no temp file left behind


def test_corrupt_entry_is_removed_with_its_descendants(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    first, second = _bound(5)
    archive.put(first, *_arrays(1))
    archive.put(second, *_arrays(2))
    path = tmp_path / "pol" / f"{first.key}.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveCorruptError):
        archive.load(archive.get(first.key))
    assert archive.get(first.key) is None and archive.get(second.key) is None
    assert archive.was_corrupt(first.key) and not path.exists()


def test_truncated_and_foreign_files_are_dropped_on_open(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    b = _bound(5)[0]
    archive.put(b, *_arrays(3))
    path = tmp_path / "pol" / f"{b.key}.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    stray = tmp_path / "pol" / "stray.safetensors"
    stray.write_bytes(b"junk")
    reopened = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert reopened.get(b.key) is None and reopened.was_corrupt(b.key)
    assert not stray.exists() and not path.exists()


def test_index_of_another_policy_is_ignored(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    archive.put(_bound(5)[0], *_arrays(4))
    index = tmp_path / "pol" / INDEX_NAME
    raw = msgpack.unpackb(index.read_bytes(), raw=False)
    raw["policy"] = "someone-else"
    index.write_bytes(msgpack.packb(raw, use_bin_type=True))
    reopened = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert len(reopened) == 0 and list((tmp_path / "pol").glob("*.safetensors")) == []


def test_size_cap_evicts_least_recently_used(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    entries = [archive.put(_bound(i, (i,))[0], *_arrays(i)) for i in range(3)]
    size = entries[0].size
    archive.load(entries[0])  # used again: now the most recent
    archive.cap_bytes = 2 * size
    newest = archive.put(_bound(9, (9,))[0], *_arrays(9))
    kept = {e.key for e in entries + [newest] if archive.get(e.key) is not None}
    assert kept == {entries[0].key, newest.key}
    assert archive.nbytes <= archive.cap_bytes


# -- through the engine ----------------------------------------------------------

def test_restart_warm_start_restores_from_disk(home, tiny_loaded, layout):
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as first:
        run(first, layout)
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as second:
        archived = [b for b in second.prefix.store.boundaries(layout)
                    if b.kind not in ("question", "header")]
        assert second.stats()["cache"]["archive_entries"] == len(archived)
        tokens, done = run(second, layout)
    assert done.metrics.cached_tokens == prefix_len(layout, len(layout) - 2)
    assert tokens == cold(tiny_loaded, layout)


def test_corrupted_archive_file_is_recomputed(home, tiny_loaded, layout):
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as first:
        run(first, layout)
    fingerprint = first.prefix.policy.fingerprint()
    bounds = first.prefix.store.boundaries(layout)
    path = home / "archive" / fingerprint / f"{bounds[2].key}.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as second:
        tokens, done = run(second, layout)
    assert done.metrics.miss_reason == "corrupt archive entry"
    assert done.metrics.cached_tokens == bounds[1].end
    assert tokens == cold(tiny_loaded, layout)


def test_other_policy_is_a_named_miss(home, tiny_loaded, layout):
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as first:
        run(first, layout)
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=8, archive_bytes=ARCHIVE_BYTES) as other:
        tokens, done = run(other, layout)
    assert done.metrics.cached_tokens == 0 and done.metrics.miss_reason == "policy mismatch"
    assert tokens == cold(tiny_loaded, layout, kv_bits=8)
