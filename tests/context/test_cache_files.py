"""Cache files that are readable but wrong: a changed byte, rows of the wrong shape. Each is
dropped (logged) and rebuilt; none crashes a build or is trusted into the prompt. Before, a
count edited to 1 made every later ask fail ("layout ... exceeds budget"), and a row of the
wrong type was a traceback on every run."""
from __future__ import annotations

import os
import time

import msgpack

from context import store
from context.graph import state_row
from context.tags import TagCache
from context.tokencache import TokenCache
from context.workspace import Workspace


def _rewrite(path, change) -> None:
    """Rewrites the dict in `path` with `change` applied, as a well-formed file with a valid checksum."""
    data = store.load(path)
    change(data)
    store.save(path, data)


def test_a_changed_byte_is_caught_by_the_checksum(tmp_path):
    path = tmp_path / "cache.msgpack"
    store.save(path, {"a": 1, "b": [1, 2, 3]})
    assert store.load(path) == {"a": 1, "b": [1, 2, 3]}
    frame = msgpack.unpackb(path.read_bytes())
    frame["data"] = frame["data"].replace(b"\x03", b"\x04")  # b: [1, 2, 4], still valid msgpack
    path.write_bytes(msgpack.packb(frame))
    assert store.load(path) == {}
    path.write_bytes(msgpack.packb({"a": 1}))  # a bare dict (the format before the frame): rebuilt
    assert store.load(path) == {}


def test_rows_of_the_wrong_shape_are_dropped(tmp_path):
    path = tmp_path / "cache.msgpack"
    store.save(path, {"good": 1, "bad": "x", 3: 4})
    assert store.load(path, lambda k, v: isinstance(k, str) and isinstance(v, int)) == {"good": 1}


def test_a_workspace_rebuilds_over_caches_with_wrong_rows(repo, smol_tokenizer, codectx_home):
    first = Workspace(repo, smol_tokenizer, budget=600)
    reference = first.build()
    first.save()
    tokens = TokenCache(smol_tokenizer)
    _rewrite(tokens.path, lambda d: d.update({next(iter(d)): 7, b"odd": b"abc"}))  # an int, a blob of 3 bytes
    _rewrite(tokens._counts_path, lambda d: d.update({k: "many" for k in list(d)[:3]}))
    tags = TagCache()
    _rewrite(tags.path, lambda d: d.update({**{k: [1, 2] for k in list(d)[:3]},  # not the outline: dropped at load
                                            **{k: [[["x"]], [], [], None] for k in list(d)[3:6]}}))  # parsed again
    _rewrite(first._state_path, lambda d: d.update(hashes=5, deps={"a.py": 3}, selected=[1]))

    again = Workspace(repo, smol_tokenizer, budget=600)
    assert again.build().segments == reference.segments  # the same prompt, recomputed where rows were dropped


def test_a_sound_state_keeps_every_row(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, budget=600)
    ws.build()
    raw = store.load(ws._state_path)
    assert set(raw) >= {"hashes", "selected", "paths_key", "deps", "rank"}
    assert store.load(ws._state_path, state_row) == raw
    assert all(isinstance(v, list) for v in store.load(TagCache().path).values())


def test_temp_files_a_killed_writer_left_are_removed_at_the_next_save(tmp_path):
    path = tmp_path / "tokens.msgpack"
    old, fresh = tmp_path / "tokens.msgpackab12cd.tmp", tmp_path / "tokens.msgpackef34gh.tmp"
    for leftover in (old, fresh):
        leftover.write_bytes(b"x" * 100)
    os.utime(old, (time.time() - 2 * store.STALE_TEMP_S,) * 2)
    store.save(path, {"a": 1})
    assert not old.exists() and fresh.exists()  # (a live writer's temp is seconds old)
    assert store.load(path) == {"a": 1}
