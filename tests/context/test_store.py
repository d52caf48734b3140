"""`context.store.save`: the cache files under CODECTX_HOME are written whole or not at all, and the
temporary file never stays behind (a token cache can be megabytes, and nothing else would remove it)."""
from __future__ import annotations

import msgpack
import pytest

from context import store


def test_a_save_writes_the_file_whole(tmp_path):
    path = tmp_path / "cache" / "tokens.msgpack"
    store.save(path, {b"k": b"v"})
    assert store.load(path) == {b"k": b"v"} and [p.name for p in path.parent.iterdir()] == ["tokens.msgpack"]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, OSError])
def test_an_interrupted_save_leaves_no_temporary_file_and_the_old_cache(tmp_path, monkeypatch, interruption):
    """Ctrl-C (or a full disk) while the file is written: the cache as it was, nothing else."""
    path = tmp_path / "tokens.msgpack"
    store.save(path, {b"old": b"1"})

    def interrupted(data, stream, **options):  # the user's Ctrl-C, arriving mid-write
        stream.write(b"\x85partial")
        raise interruption("interrupted")

    monkeypatch.setattr(msgpack, "pack", interrupted)
    if interruption is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            store.save(path, {b"new": b"2"})
    else:
        store.save(path, {b"new": b"2"})  # logged, not raised
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.msgpack"] and store.load(path) == {b"old": b"1"}
