"""One archive folder shared by several processes (two asks at once, a server and a CLI).

Two `CheckpointArchive` instances on one root stand for two processes: each takes the folder's
lock file through its own open of it, which flock keeps apart exactly as it keeps processes apart.
One test starts a real second process.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import msgpack
import pytest

from checkpoint_helpers import archive_arrays, archive_bounds
from engine import archive_format
from engine.archive import INDEX_NAME, ArchiveCorruptError, CheckpointArchive
from engine.archive_files import LOCK_NAME

REPO_ROOT = Path(__file__).resolve().parents[2]


def _bound(i: int):
    return archive_bounds(i, (i,))[0]


def _prepared(seed: int) -> list[archive_format.Entry]:
    kv, rec = archive_arrays(seed)
    return archive_format.prepare({**kv, **rec})


def _indexed(directory: Path) -> set[str]:
    return set(msgpack.unpackb((directory / INDEX_NAME).read_bytes(), raw=False)["entries"])


def _files(directory: Path) -> set[str]:
    return {p.name.removesuffix(".safetensors") for p in directory.glob("*.safetensors")}


def _temps(directory: Path) -> list[Path]:
    return list(directory.glob(".*.tmp"))


def _lock_is_held(directory: Path) -> bool:
    """True when someone holds the folder's lock file (asked as another process would, without waiting)."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _loads_as_written(archive: CheckpointArchive, key: str, seed: int) -> bool:
    kv, rec = archive.load(archive.get(key))
    want_kv, want_rec = archive_arrays(seed)
    return mx.array_equal(kv["1.kv.0"], want_kv["1.kv.0"]) and mx.array_equal(rec["0.rec.0"], want_rec["0.rec.0"])


def test_an_archive_opening_mid_write_leaves_the_writer_on_and_then_sees_its_checkpoint(tmp_path):
    directory = tmp_path / "pol"
    a = CheckpointArchive("pol", 1 << 20, tmp_path)
    b_box: list[CheckpointArchive] = []
    spared: list[int] = []

    def between() -> None:  # A's writer pauses here (a request runs) while B starts on the same folder
        if not b_box:
            b_box.append(CheckpointArchive("pol", 1 << 20, tmp_path))
            spared.append(len(_temps(directory)))

    first = _bound(1)
    entry = a._put(first, _prepared(1), between=between)
    b = b_box[0]
    assert spared == [1]  # B's sweep left A's half-written temp file alone
    assert a.state == "on" and b.state == "on" and entry is not None
    assert _indexed(directory) == _files(directory) == {first.key} and not _temps(directory)
    assert b.get(first.key) is not None and _loads_as_written(b, first.key, 1)  # B re-read the changed index
    second = _bound(2)
    assert a.put(second, *archive_arrays(2)) is not None and _indexed(directory) == {first.key, second.key}


def test_a_real_second_process_opening_mid_write_leaves_the_writer_on(tmp_path):
    opener = ("import sys; from engine import blas; blas.preload(); from engine.archive import CheckpointArchive; "
              "a = CheckpointArchive('pol', 1 << 20, sys.argv[1]); print(a.state)")
    runs: list[subprocess.CompletedProcess] = []

    def between() -> None:
        if not runs:
            runs.append(subprocess.run([sys.executable, "-c", opener, str(tmp_path)], capture_output=True, text=True,
                                       env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), cwd=REPO_ROOT, timeout=120,
                                       stdin=subprocess.DEVNULL))

    a = CheckpointArchive("pol", 1 << 20, tmp_path)
    first = _bound(1)
    entry = a._put(first, _prepared(1), between=between)
    assert runs[0].returncode == 0 and runs[0].stdout.strip() == "on", runs[0].stderr
    assert a.state == "on" and entry is not None
    assert _indexed(tmp_path / "pol") == _files(tmp_path / "pol") == {first.key}


def test_two_writers_keep_each_others_checkpoints(tmp_path):
    a = CheckpointArchive("pol", 1 << 20, tmp_path)
    b = CheckpointArchive("pol", 1 << 20, tmp_path)
    x, y = _bound(1), _bound(2)
    assert a.put(x, *archive_arrays(1)) is not None
    assert b.put(y, *archive_arrays(2)) is not None
    b.close()
    a.close()  # the last to write knew only its own entry in memory when it opened
    c = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert c.get(x.key) is not None and c.get(y.key) is not None
    assert _files(tmp_path / "pol") == _indexed(tmp_path / "pol") == {x.key, y.key}
    assert _loads_as_written(c, x.key, 1) and _loads_as_written(c, y.key, 2)


def test_the_sweep_removes_temp_files_of_dead_writers_only(tmp_path):
    directory = tmp_path / "pol"
    directory.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited and reaped: its pid names no process now
    key = "0123456789abcdef"
    dead = directory / f".{key}.safetensors.{gone.pid}.140001.tmp"
    live = directory / f".{key}.safetensors.{os.getpid()}.140002.tmp"
    live_index = directory / f".{INDEX_NAME}.{os.getpid()}.140003.tmp"
    group = directory / f".{key}.safetensors.0.140004.tmp"  # pid 0 would be our own process group
    for path in (dead, live, live_index, group):
        path.write_bytes(b"half written")
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert archive.state == "on"
    assert sorted(p.name for p in directory.iterdir()) == sorted([LOCK_NAME, INDEX_NAME, live.name, live_index.name])


def test_a_temp_file_removed_under_a_writer_loses_that_write_only(tmp_path, caplog):
    directory = tmp_path / "pol"
    a = CheckpointArchive("pol", 1 << 20, tmp_path)

    def between() -> None:  # e.g. removed by hand, or by an older codectx's sweep
        for temp in _temps(directory):
            temp.unlink()

    lost = _bound(1)
    assert a._put(lost, _prepared(1), between=between) is None
    assert a.state == "on" and a.get(lost.key) is None
    assert any("lost the write" in r.getMessage() and lost.key in r.getMessage() for r in caplog.records)
    kept = _bound(2)
    assert a.put(kept, *archive_arrays(2)) is not None
    assert _indexed(directory) == _files(directory) == {kept.key} and not _temps(directory)


def test_a_removal_by_one_writer_is_not_undone_by_the_other(tmp_path, caplog):
    directory = tmp_path / "pol"
    a = CheckpointArchive("pol", 1 << 20, tmp_path)
    b = CheckpointArchive("pol", 1 << 20, tmp_path)
    x, y = _bound(1), _bound(2)
    assert a.put(x, *archive_arrays(1)) is not None
    assert b.get(x.key) is not None  # taken in from the index A wrote
    path = directory / f"{x.key}.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveCorruptError):
        a.load(a.get(x.key))
    assert b.put(y, *archive_arrays(2)) is not None  # B still held x in memory: its write must not bring x back
    assert b.get(x.key) is None and _indexed(directory) == _files(directory) == {y.key}
    caplog.clear()
    c = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert len(c) == 1 and not c.was_corrupt(x.key)  # no row naming a missing file
    assert not [r for r in caplog.records if "dropping" in r.getMessage()]


def test_the_size_cap_applies_to_every_writers_entries_together(tmp_path):
    directory = tmp_path / "pol"
    a = CheckpointArchive("pol", 1 << 20, tmp_path)
    b = CheckpointArchive("pol", 1 << 20, tmp_path)
    x, y, z = _bound(1), _bound(2), _bound(3)
    oldest = a.put(x, *archive_arrays(1))
    assert b.put(y, *archive_arrays(2)) is not None
    oldest.last_used = 0.0
    a.cap_bytes = 2 * oldest.size
    assert a.put(z, *archive_arrays(3)).size == oldest.size
    assert _indexed(directory) == _files(directory) == {y.key, z.key}  # A's own oldest went, B's stayed
    assert sum(p.stat().st_size for p in directory.glob("*.safetensors")) <= a.cap_bytes


def test_a_checkpoint_is_renamed_into_place_under_the_lock_and_written_outside_it(tmp_path, monkeypatch):
    directory = tmp_path / "pol"
    a = CheckpointArchive("pol", 1 << 20, tmp_path)
    held: list[tuple[str, bool]] = []
    real_replace = os.replace

    def replace(src, dst):  # the archive's rename of a checkpoint file (the index's goes through its own default)
        held.append(("rename", _lock_is_held(directory)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    b, entries = _bound(1), _prepared(1)
    assert a._put(b, entries, between=lambda: held.append(("write", _lock_is_held(directory)))) is not None
    assert held == [("write", False)] * len(entries) + [("rename", True)]
    assert not _lock_is_held(directory) and _indexed(directory) == {b.key}


def test_a_lock_file_planted_as_a_link_is_never_followed(tmp_path, caplog):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    directory = tmp_path / "archive" / "pol"
    directory.mkdir(parents=True)
    (directory / LOCK_NAME).symlink_to(victim)
    archive = CheckpointArchive("pol", 1 << 20, tmp_path / "archive")
    assert archive.state.startswith("off: cannot write") and LOCK_NAME in archive.state
    assert archive.put(_bound(1), *archive_arrays(1)) is None
    assert victim.read_bytes() == b"keep me" and (directory / LOCK_NAME).is_symlink()
