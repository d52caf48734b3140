"""The disk archive: round trip, restart warm start, corrupt/truncated/foreign entries, cap."""
from __future__ import annotations

import threading

import mlx.core as mx
import msgpack
import pytest

from checkpoint_helpers import archive_arrays, archive_bounds, ask, cold, prefix_len, repo_segments, run
from engine.archive import INDEX_NAME, ArchiveCorruptError, CheckpointArchive
from engine.archive_files import LOCK_NAME
from engine.archive_reads import read_ahead
from engine.engine import Engine
from engine.request import Request
from engine.window import WindowPolicy

ARCHIVE_BYTES = 64 << 20


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def layout(tiny_loaded):
    return ask(tiny_loaded.tokenizer, repo_segments(tiny_loaded.tokenizer), "Where is main?")


def test_round_trip_and_reopen(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    b = archive_bounds(5)[1]
    kv, rec = archive_arrays(0)
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
    first, second = archive_bounds(5)
    archive.put(first, *archive_arrays(1))
    archive.put(second, *archive_arrays(2))
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
    b = archive_bounds(5)[0]
    archive.put(b, *archive_arrays(3))
    path = tmp_path / "pol" / f"{b.key}.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    stray = tmp_path / "pol" / "stray.safetensors"
    stray.write_bytes(b"junk")
    reopened = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert reopened.get(b.key) is None and reopened.was_corrupt(b.key)
    assert not stray.exists() and not path.exists()


def test_index_of_another_policy_is_ignored(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    archive.put(archive_bounds(5)[0], *archive_arrays(4))
    index = tmp_path / "pol" / INDEX_NAME
    raw = msgpack.unpackb(index.read_bytes(), raw=False)
    raw["policy"] = "someone-else"
    index.write_bytes(msgpack.packb(raw, use_bin_type=True))
    reopened = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert len(reopened) == 0 and list((tmp_path / "pol").glob("*.safetensors")) == []


def test_size_cap_evicts_least_recently_used(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    entries = [archive.put(archive_bounds(i, (i,))[0], *archive_arrays(i)) for i in range(3)]
    size = entries[0].size
    archive.load(entries[0])  # used again: now the most recent
    archive.cap_bytes = 2 * size
    newest = archive.put(archive_bounds(9, (9,))[0], *archive_arrays(9))
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


def test_a_file_that_cannot_be_read_is_a_corrupt_entry_not_a_failed_request(home, tiny_loaded, layout, monkeypatch):
    """Files are read ahead on helper threads: whatever a read raises comes back as that entry's miss."""
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as first:
        run(first, layout)
    bounds = first.prefix.store.boundaries(layout)
    real_read = CheckpointArchive._read

    def read(self, entry):
        if entry.key == bounds[2].key:
            raise MemoryError("no room for this file")
        return real_read(self, entry)

    monkeypatch.setattr(CheckpointArchive, "_read", read)
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as second:
        tokens, done = run(second, layout)
    assert done.finish_reason in ("length", "stop") and done.metrics.miss_reason == "corrupt archive entry"
    assert done.metrics.cached_tokens == bounds[1].end
    assert tokens == cold(tiny_loaded, layout)


def test_other_policy_is_a_named_miss(home, tiny_loaded, layout):
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as first:
        run(first, layout)
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=8, archive_bytes=ARCHIVE_BYTES) as other:
        tokens, done = run(other, layout)
    assert done.metrics.cached_tokens == 0 and done.metrics.miss_reason == "policy mismatch"
    assert tokens == cold(tiny_loaded, layout, kv_bits=8)


# -- fail safe: unwritable folders, crafted indexes, the cap at open ----------------

def _off_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "engine.archive" and r.getMessage().startswith("archive off:")]


def _index(directory, entries: dict, policy: str = "pol") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"format": 1, "policy": policy, "entries": entries}
    (directory / INDEX_NAME).write_bytes(msgpack.packb(payload, use_bin_type=True))


def _row(key: str, size: int = 4, **over) -> dict:
    row = {"key": key, "token_key": "t", "parent": "", "start": 0, "end": 2, "tokens": b"\0" * 8,
           "kind": "file", "protected": False, "size": size, "checksum": "0", "last_used": 1.0}
    return {**row, **over}


def test_root_that_cannot_be_a_folder_turns_the_archive_off_once(tmp_path, caplog):
    root = tmp_path / "archive"
    root.write_text("a file where the archive folder should be")
    archive = CheckpointArchive("pol", 1 << 20, root)
    assert archive.state.startswith("off: cannot write") and str(root) in archive.state
    for i in range(3):
        archive.submit(archive_bounds(i, (i,))[0], *archive_arrays(i))
        assert archive.put(archive_bounds(i, (i,))[1], *archive_arrays(i)) is None
    archive.close()
    assert len(archive) == 0 and archive.get(archive_bounds(0, (0,))[0].key) is None
    assert not archive.other_policy_has("anything")
    assert len(_off_warnings(caplog)) == 1
    assert root.read_text() == "a file where the archive folder should be"


def test_folder_lost_while_writing_turns_the_archive_off_once(tmp_path, caplog):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    first = archive_bounds(1, (1,))[0]
    assert archive.put(first, *archive_arrays(1)) is not None
    for path in (tmp_path / "pol").iterdir():
        path.unlink()
    (tmp_path / "pol").rmdir()
    (tmp_path / "pol").write_text("blocked")  # every later mkdir, write and rename fails
    for i in range(2, 5):
        archive.submit(archive_bounds(i, (i,))[0], *archive_arrays(i))
    archive.flush()
    assert archive.state.startswith("off: ") and len(archive) == 0 and archive.get(first.key) is None
    archive.close()
    assert len(_off_warnings(caplog)) == 1


def test_a_checkpoint_with_an_array_safetensors_cannot_name_is_skipped_with_one_warning(tmp_path, caplog):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    first, second = archive_bounds(5)
    kv, rec = archive_arrays(1)
    unnamed = {**kv, "1.kv.2": mx.zeros((2,), dtype=mx.complex64)}
    assert archive.put(first, unnamed, rec) is None
    archive.submit(second, unnamed, rec)
    archive.flush()
    warnings = [r.getMessage() for r in caplog.records if r.name == "engine.archive"]
    assert len(warnings) == 2 and all("complex64" in m for m in warnings)
    assert first.key in warnings[0] and second.key in warnings[1]
    assert len(archive) == 0 and not list((tmp_path / "pol").glob("*.safetensors"))
    assert archive.state == "on" and archive.put(first, kv, rec) is not None  # the next checkpoint is archived
    archive.close()


def test_engine_with_an_unwritable_archive_answers_like_a_cold_engine(home, tiny_loaded, layout,
                                                                       caplog):
    (home / "archive").write_text("not a folder")
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as engine:
        assert engine.stats()["archive"].startswith("off: cannot write")
        first, _ = run(engine, layout)
        second, done = run(engine, layout)  # in-memory checkpoints still serve
        engine.set_window(WindowPolicy(global_tokens=32, window_tokens=32, dense_tail=16))
        third, _ = run(engine, layout)  # a policy switch keeps the archive off, silently
        assert engine.stats()["archive"].startswith("off: ")
    assert first == second == cold(tiny_loaded, layout) and done.metrics.cached_tokens > 0
    assert third and engine.stats()["requests_failed"] == 0
    assert len(_off_warnings(caplog)) == 1


def test_crafted_index_keys_never_touch_files_outside(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"keep me")
    root = tmp_path / "deep" / "archive"
    directory = root / "pol"
    link_key = "ab" * 8
    _index(directory, {
        "../../../outside/victim": _row("../../../outside/victim", 7),
        str(victim): _row(str(victim), 7),
        "..": _row("..", 7),
        "ABCDEF0123456789": _row("ABCDEF0123456789"),  # hex, but not the form the engine writes
        "0123456789abcdef": _row("fedcba9876543210"),  # row names another key
        link_key: _row(link_key, 7),
    })
    (directory / f"{link_key}.safetensors").symlink_to(victim)  # a link is not an entry
    (directory / "stray.safetensors").symlink_to(victim)  # removing a link leaves its target
    archive = CheckpointArchive("pol", 1 << 20, root)
    assert archive.state == "on" and len(archive) == 0
    assert victim.read_bytes() == b"keep me"
    assert sorted(p.name for p in directory.iterdir()) == [LOCK_NAME, INDEX_NAME]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "dropping 5 archive index entries" in messages and link_key in messages
    b = archive_bounds(7)[0]
    assert archive.put(b, *archive_arrays(7)) is not None and archive.get(b.key) is not None


def test_linked_or_crafted_policy_folders_are_not_used(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.safetensors").write_bytes(b"keep me")
    root = tmp_path / "archive"
    root.mkdir()
    (root / "pol").symlink_to(outside, target_is_directory=True)
    archive = CheckpointArchive("pol", 1 << 20, root)
    assert archive.state.endswith("is a symbolic link")
    assert archive.put(archive_bounds(1)[0], *archive_arrays(1)) is None
    crafted = CheckpointArchive("../outside", 1 << 20, root)
    assert crafted.state.startswith("off: policy '../outside' is not a plain")
    assert sorted(p.name for p in outside.iterdir()) == ["precious.safetensors"]
    assert len(_off_warnings(caplog)) == 2  # one per archive


def test_other_policy_scan_skips_links_and_garbage(tmp_path):
    b = archive_bounds(3)[0]
    root = tmp_path / "archive"
    outside = tmp_path / "outside"
    _index(outside, {b.key: _row(b.key, token_key=b.token_key)}, policy="evil")
    root.mkdir()
    (root / "evil").symlink_to(outside, target_is_directory=True)
    _index(root / "garbage", {"x": ["not", "a", "row"]}, policy="garbage")
    _index(root / "list", [], policy="list")
    archive = CheckpointArchive("pol", 1 << 20, root)
    assert not archive.other_policy_has(b.token_key)
    _index(root / "real", {b.key: _row(b.key, token_key=b.token_key)}, policy="real")
    assert archive.other_policy_has(b.token_key)


def test_size_cap_is_applied_when_the_archive_opens(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    entries = [archive.put(archive_bounds(i, (i,))[0], *archive_arrays(i)) for i in range(4)]
    archive.close()
    size = entries[0].size
    index = tmp_path / "pol" / INDEX_NAME
    raw = msgpack.unpackb(index.read_bytes(), raw=False)
    for i, e in enumerate(entries):  # oldest first; the oldest is protected
        raw["entries"][e.key]["last_used"] = float(i)
    raw["entries"][entries[0].key]["protected"] = True
    index.write_bytes(msgpack.packb(raw, use_bin_type=True))
    reopened = CheckpointArchive("pol", 2 * size, tmp_path)  # a lowered cap, nothing written yet
    kept = {e.key for e in entries if reopened.get(e.key) is not None}
    assert kept == {entries[0].key, entries[3].key}
    files = sorted(p.name for p in (tmp_path / "pol").glob("*.safetensors"))
    assert files == sorted(f"{k}.safetensors" for k in kept)
    assert reopened.nbytes <= 2 * size
    again = CheckpointArchive("pol", 2 * size, tmp_path)  # the trimmed index was saved
    assert {e.key for e in entries if again.get(e.key) is not None} == kept


def test_cap_evicts_leaves_first_so_a_kept_entry_keeps_its_prefix(tmp_path):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    parent, child = archive_bounds(5)
    older = archive.put(parent, *archive_arrays(1))
    newer = archive.put(child, *archive_arrays(2))
    other = archive.put(archive_bounds(6, (6,))[0], *archive_arrays(3))
    older.last_used, other.last_used = 0.0, 1.0  # the prefix is oldest, its child newest
    archive.close()
    reopened = CheckpointArchive("pol", older.size + newer.size, tmp_path)
    assert reopened.get(parent.key) is not None and reopened.get(child.key) is not None
    assert reopened.get(other.key) is None


def test_writes_wait_while_a_request_runs_and_a_flush_drains_them_anyway(tmp_path):
    """A request pauses the writer (writes compete with it for the device); close and flush still write."""
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    b = archive_bounds(7)[1]
    with archive.paused():
        archive.submit(b, *archive_arrays(7))
        assert not archive._may_write.is_set()
        flusher = threading.Thread(target=archive.flush)
        flusher.start()
        flusher.join(timeout=60)
        assert not flusher.is_alive()  # a flush inside a request does not wait for it to end
        assert archive.get(b.key) is not None
    assert archive._may_write.is_set()
    archive.close()


def test_the_engine_pauses_its_archive_while_it_serves_a_request(home, tiny_loaded, layout):
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as engine:
        seen: list[bool] = []
        done = engine.submit(Request(segments=layout, max_tokens=4),
                             on_progress=lambda *_: seen.append(engine.prefix.archive._may_write.is_set())).result()
        assert done.finish_reason in ("length", "stop") and seen and not any(seen)
        assert engine.prefix.archive._may_write.is_set()


@pytest.mark.parametrize("workers", [1, 2])
def test_read_ahead_yields_in_order_at_most_depth_reads_ahead_and_hands_back_read_errors(workers):
    started: list[int] = []

    def read(i: int) -> bytes:
        started.append(i)
        if i == 3:
            raise OSError("gone")
        if i == 4:
            raise MemoryError("too big")  # not only OSError: any failed read is a bad entry, not a failed restore
        return bytes([i])

    got = []
    for item, data in read_ahead(list(range(6)), read, depth=2, workers=workers):
        assert len(started) <= item + 3  # the one consumed plus at most two ahead
        got.append((item, data if isinstance(data, bytes) else str(data)))
    assert got == [(0, b"\x00"), (1, b"\x01"), (2, b"\x02"), (3, "gone"), (4, "too big"), (5, b"\x05")]
    started.clear()
    for item, _ in read_ahead(list(range(6)), read, depth=2, workers=workers):
        break  # a restore that stops early (a corrupt entry) leaves the rest unread
    assert item == 0 and len(started) <= 3
