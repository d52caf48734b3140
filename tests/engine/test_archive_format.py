"""Checkpoint files written array by array: what MLX reads back, the checksum of the bytes
written, and the background writer pausing between arrays while a request runs."""
from __future__ import annotations

import io
import threading

import mlx.core as mx
import pytest
import xxhash

from engine import archive_format
from engine.archive import CheckpointArchive
from engine.boundaries import boundaries
from engine.request import PromptSegment

DTYPES = [mx.bfloat16, mx.float16, mx.float32, mx.uint32, mx.int32, mx.uint8, mx.int8, mx.bool_]


def _arrays() -> dict[str, mx.array]:
    base = mx.random.normal((1, 2, 40, 8), key=mx.random.key(3)) * 100
    arrays = {f"{i}.kv.0": (base > 0) if dtype == mx.bool_ else base.astype(dtype) for i, dtype in enumerate(DTYPES)}
    arrays["9.kv.1"] = base.astype(mx.bfloat16)[..., :17, :]  # a slice of a larger buffer, as live caches give
    arrays["9.kv.2"] = mx.array([-0.0, float("nan"), float("inf")], dtype=mx.float16)  # bits, not values
    arrays["9.kv.3"] = mx.zeros((1, 2, 0, 8), dtype=mx.bfloat16)  # an empty span
    mx.eval(list(arrays.values()))
    return arrays


def _bits(a: mx.array) -> mx.array:
    return a.astype(mx.uint8) if a.dtype == mx.bool_ else mx.contiguous(a).view(
        {1: mx.uint8, 2: mx.uint16, 4: mx.uint32}[a.itemsize])


def test_mlx_reads_back_every_array_bit_for_bit_with_the_metadata_and_the_fed_checksum():
    arrays, buffer, fed = _arrays(), io.BytesIO(), xxhash.xxh3_64()
    size = archive_format.write(buffer, archive_format.prepare(arrays), {"key": "k", "policy": "p"}, fed.update)
    data = buffer.getvalue()
    assert size == len(data) and fed.hexdigest() == xxhash.xxh3_64_hexdigest(data)
    loaded, metadata = mx.load(io.BytesIO(data), format="safetensors", return_metadata=True)
    assert metadata == {"key": "k", "policy": "p"} and set(loaded) == set(arrays)
    for name, a in arrays.items():
        assert loaded[name].dtype == a.dtype and loaded[name].shape == a.shape, name
        assert mx.array_equal(_bits(loaded[name]), _bits(a)), name


def test_the_same_arrays_as_mlx_s_own_writer_gives():
    arrays, ours, theirs = _arrays(), io.BytesIO(), io.BytesIO()
    archive_format.write(ours, archive_format.prepare(arrays), {"key": "k"}, lambda _: None)
    mx.save_safetensors(theirs, arrays, metadata={"key": "k"})
    a = mx.load(io.BytesIO(ours.getvalue()), format="safetensors")
    b = mx.load(io.BytesIO(theirs.getvalue()), format="safetensors")
    assert set(a) == set(b) and all(mx.array_equal(_bits(a[k]), _bits(b[k])) for k in a)


def test_between_runs_before_each_array_once_the_header_is_out():
    arrays, buffer, seen = _arrays(), io.BytesIO(), []
    entries = archive_format.prepare(arrays)
    archive_format.write(buffer, entries, {}, lambda _: None, between=lambda: seen.append(buffer.tell()))
    header = len(archive_format.header(entries, {}))
    ends = [header + sum(a.nbytes for a in list(arrays.values())[:i]) for i in range(len(arrays))]
    assert seen == ends and header % 8 == 0


def test_a_dtype_safetensors_cannot_name_is_refused_before_anything_is_written():
    with pytest.raises(ValueError, match="complex64"):
        archive_format.prepare({"0.kv.0": mx.zeros((2,), dtype=mx.complex64)})


class _Gate(threading.Event):
    """The archive's may-write event, telling when the writer starts to wait on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout=None):
        if not self.is_set():
            self.waiting.set()
        return super().wait(timeout)


def test_a_write_under_way_waits_between_arrays_while_a_request_runs(tmp_path, monkeypatch):
    archive = CheckpointArchive("pol", 1 << 30, tmp_path)
    archive._may_write = gate = _Gate()
    gate.set()
    written = []

    def first_array_then_a_request_begins(a):
        written.append(a)
        if len(written) == 1:
            gate.clear()  # what `paused()` does when a request starts
        return original(a)

    original = archive_format.array_bytes
    monkeypatch.setattr(archive_format, "array_bytes", first_array_then_a_request_begins)
    segments = [PromptSegment("file", "a", (1, 2, 3)), PromptSegment("file", "b", (4, 5))]
    b = boundaries("pol", segments)[1]
    kv = {f"{i}.kv.0": mx.full((1, 1, 2, 8), float(i)) for i in range(4)}
    try:
        archive.submit(b, kv, {})
        assert gate.waiting.wait(timeout=60)
        final = tmp_path / "pol" / f"{b.key}.safetensors"
        assert len(written) == 1 and not final.exists() and archive.get(b.key) is None
    finally:
        gate.set()  # the request ended
        archive.flush()
    loaded, _ = archive.load(archive.get(b.key))
    assert len(written) == 4 and all(mx.array_equal(loaded[k], kv[k]) for k in kv)
    archive.close()
