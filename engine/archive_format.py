"""A checkpoint's archive file: safetensors, written one array at a time.

The file is what `mx.save_safetensors` writes and `mx.load` reads (an 8-byte little-endian
header length, a JSON header naming each array's dtype, shape and byte range, with the
metadata under ``__metadata__``, padded with spaces to 8 bytes; then the arrays' bytes), but
the bytes go to the file array by array instead of through one buffer of the whole file:

- the host holds one array's bytes at a time, not two copies of a checkpoint that can span
  gigabytes at 128k tokens (the buffer, then its ``getvalue()``);
- between arrays the writer can wait (`between`): the archive's background writer pauses there
  while a request runs, so a write under way delays a request by one array, not by a whole file
  (reading an array of the GPU's memory to the host also synchronizes with the GPU's stream);
- the checksum is fed as the bytes go, over exactly the bytes written.
"""
from __future__ import annotations

import json
from typing import Any, BinaryIO, Callable, Mapping

import mlx.core as mx
import numpy as np

# safetensors' dtype names, and an unsigned type of the same width to read the bytes through
_DTYPES: dict[Any, tuple[str, Any]] = {
    mx.bool_: ("BOOL", mx.uint8), mx.uint8: ("U8", mx.uint8), mx.int8: ("I8", mx.uint8),
    mx.uint16: ("U16", mx.uint16), mx.int16: ("I16", mx.uint16), mx.float16: ("F16", mx.uint16),
    mx.bfloat16: ("BF16", mx.uint16), mx.uint32: ("U32", mx.uint32), mx.int32: ("I32", mx.uint32),
    mx.float32: ("F32", mx.uint32), mx.uint64: ("U64", mx.uint64), mx.int64: ("I64", mx.uint64),
}


def header(arrays: Mapping[str, mx.array], metadata: Mapping[str, str]) -> bytes:
    """The file's first bytes: header length, then the JSON header padded to a multiple of 8.

    Raises:
        ValueError: An array of a dtype safetensors has no name for.
    """
    table: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, a in arrays.items():
        if a.dtype not in _DTYPES:
            raise ValueError(f"cannot archive {name}: dtype {a.dtype}")
        table[name] = {"dtype": _DTYPES[a.dtype][0], "shape": list(a.shape),
                       "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(table, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def array_bytes(a: mx.array) -> memoryview:
    """`a`'s bytes in row-major order, without a copy where `a` is already contiguous."""
    flat = mx.contiguous(a).view(_DTYPES[a.dtype][1])
    return memoryview(np.ascontiguousarray(np.asarray(flat))).cast("B")


def write(handle: BinaryIO, arrays: Mapping[str, mx.array], metadata: Mapping[str, str],
          feed: Callable[[bytes | memoryview], None], between: Callable[[], None] | None = None) -> int:
    """Write the file to `handle`, each piece also to `feed` (a checksum); bytes written.

    `between` runs before each array's bytes are read and written (the writer's pause point).
    """
    first = header(arrays, metadata)
    handle.write(first)
    feed(first)
    size = len(first)
    for a in arrays.values():
        if between is not None:
            between()
        data = array_bytes(a)
        handle.write(data)
        feed(data)
        size += data.nbytes
        del data
    return size
