"""A checkpoint's archive file: safetensors, written one array at a time.

The file is what `mx.save_safetensors` writes and `mx.load` reads (an 8-byte little-endian
header length, a JSON header naming each array's dtype, shape and byte range, with the
metadata under ``__metadata__``, padded with spaces to 8 bytes; then the arrays' bytes), but
the bytes go to the file array by array instead of through one buffer of the whole file:

- the bytes go from each array's own buffer to the file: no buffer of the whole file and no
  ``getvalue()`` copy of it (a cold 128k prompt's checkpoints are 32.25 GiB in the GPU engine
  benchmark: docs/benchmarks.md, *GPU engine*, fifth session, runs f and g);
- between arrays the writer can wait (`between`): the archive's background writer pauses there
  while a request runs, so a write under way holds a request up by at most one array (on MLX's
  CUDA backend, a host read of an array's buffer is a blocking copy: its `raw_ptr` moves the
  buffer to unified memory with `cudaMemcpy`). On the H200 at 128k the edit + ask took 1.270 s
  with the cold prompt's archive being written beside it and 1.253 s with no archive (run i);
- the checksum is fed as the bytes go, over exactly the bytes written.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Mapping, Sequence

import mlx.core as mx
import numpy as np

# safetensors' dtype names
_DTYPES: dict[Any, str] = {
    mx.bool_: "BOOL", mx.uint8: "U8", mx.int8: "I8", mx.uint16: "U16", mx.int16: "I16", mx.float16: "F16",
    mx.bfloat16: "BF16", mx.uint32: "U32", mx.int32: "I32", mx.float32: "F32", mx.uint64: "U64", mx.int64: "I64",
}
# the unsigned type of each width (bytes) to read an array's bytes through
_UNSIGNED = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


@dataclass(frozen=True)
class Entry:
    """One array made ready for the file: its bytes as an evaluated, contiguous unsigned array."""

    name: str
    dtype: str  # safetensors' name of the array's dtype
    words: mx.array  # same shape as the array (an unsigned type of its width)

    @property
    def nbytes(self) -> int:
        return self.words.nbytes


def prepare(arrays: Mapping[str, mx.array]) -> list[Entry]:
    """The entries of `arrays`, evaluated. Call it on the MLX thread: the writer thread then only reads
    finished buffers and runs no MLX operation of its own.

    Raises:
        ValueError: An array of a dtype safetensors has no name for.
    """
    entries = []
    for name, a in arrays.items():
        if a.dtype not in _DTYPES:
            raise ValueError(f"cannot archive {name}: dtype {a.dtype}")
        entries.append(Entry(name, _DTYPES[a.dtype], mx.contiguous(a).view(_UNSIGNED[a.dtype.size])))
    mx.eval([e.words for e in entries])
    return entries


def header(entries: Sequence[Entry], metadata: Mapping[str, str]) -> bytes:
    """The file's first bytes: header length, then the JSON header padded to a multiple of 8."""
    table: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for e in entries:
        table[e.name] = {"dtype": e.dtype, "shape": list(e.words.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(table, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def array_bytes(entry: Entry) -> memoryview:
    """The entry's bytes in row-major order (a view of its evaluated buffer, no copy)."""
    return memoryview(np.asarray(entry.words).reshape(-1).view(np.uint8))


def write(handle: BinaryIO, entries: Sequence[Entry], metadata: Mapping[str, str],
          feed: Callable[[bytes | memoryview], None], between: Callable[[], None] | None = None) -> int:
    """Write the file to `handle`, each piece also to `feed` (a checksum); bytes written.

    `between` runs before each array's bytes are read and written (the writer's pause point).
    """
    first = header(entries, metadata)
    handle.write(first)
    feed(first)
    size = len(first)
    for entry in entries:
        if between is not None:
            between()
        data = array_bytes(entry)
        handle.write(data)
        feed(data)
        size += data.nbytes
    return size
