"""A disk that fills between a checkpoint's file and its index row leaves no file the index does not name."""
from __future__ import annotations

import errno

from checkpoint_helpers import archive_arrays, archive_bounds
from engine import archive_entry
from engine.archive import CheckpointArchive


def test_a_checkpoint_whose_index_row_cannot_be_written_is_removed_and_the_archive_turns_off(tmp_path, monkeypatch,
                                                                                           caplog):
    archive = CheckpointArchive("pol", 1 << 20, tmp_path)
    kept, lost = archive_bounds(1, (1,))[0], archive_bounds(7, (7,))[0]
    assert archive.put(kept, *archive_arrays(1)) is not None

    def full_disk(path, data):  # stands in for the file system: the index is the write that meets a full disk
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(archive_entry, "write_atomically", full_disk)
    assert archive.put(lost, *archive_arrays(7)) is None
    assert archive.state.startswith("off: cannot write") and "No space left" in archive.state
    files = sorted(p.name for p in (tmp_path / "pol").iterdir() if not p.name.startswith("."))
    assert files == sorted(["index.msgpack", f"{kept.key}.safetensors"])  # the lost checkpoint's file is gone
    archive.close()
    monkeypatch.undo()  # the disk has room again
    reopened = CheckpointArchive("pol", 1 << 20, tmp_path)
    assert reopened.state == "on" and reopened.get(kept.key) is not None and reopened.get(lost.key) is None
    assert len([r for r in caplog.records if r.getMessage().startswith("archive off:")]) == 1
