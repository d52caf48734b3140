"""Read a GGUF file with the `gguf` package (llama.cpp's own Python library).

The package memory-maps the file: metadata arrives as Python values and each
tensor as its raw blocks, dequantized to float32 on request by the package's
NumPy dequantizers (every type it knows: floats, the legacy quants, the
K-quants and the i-quants). Nothing here writes anything.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelLoadError

_FLOAT_TYPES = ("F32", "F16", "BF16")
_PLAIN_TYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}


@functools.cache
def convertible_types() -> tuple[str, ...]:
    """GGML tensor type names this reader dequantizes: plain arrays, and what the `gguf`
    package dequantizes (probed once per process)."""
    from gguf import GGMLQuantizationType, quants

    names = []
    for qtype in GGMLQuantizationType:
        if qtype.name in _FLOAT_TYPES or qtype.name in _PLAIN_TYPES:
            continue
        probe = np.zeros(quants.GGML_QUANT_SIZES[qtype][1], dtype=np.uint8)
        try:
            quants.dequantize(probe, qtype)
        except NotImplementedError:
            continue
        names.append(qtype.name)
    return (*_FLOAT_TYPES, *(t for t in _PLAIN_TYPES if t not in _FLOAT_TYPES), *names)


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of a GGUF file.

    Attributes:
        name: Its GGUF name ("blk.0.attn_q.weight").
        kind: Its GGML type name ("Q4_K", "F32").
        shape: NumPy order (rows first): a weight is (out_features, in_features).
        nbytes: Bytes it occupies in the file.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    nbytes: int
    _raw: Any

    def dequantized(self) -> np.ndarray:
        """The tensor as float32 values.

        Raises:
            ModelLoadError: Its type cannot be dequantized (the message names it).
        """
        from gguf import GGMLQuantizationType, quants

        if self.kind in _PLAIN_TYPES:
            return self._raw.view(_PLAIN_TYPES[self.kind]).astype(np.float32).reshape(self.shape)
        try:
            values = quants.dequantize(self._raw.reshape(1, -1), GGMLQuantizationType[self.kind])
        except NotImplementedError as err:
            raise ModelLoadError(
                f"tensor {self.name} has GGUF type {self.kind}, which codectx cannot convert "
                f"(convertible: {', '.join(convertible_types())})"
            ) from err
        return np.asarray(values, dtype=np.float32).reshape(self.shape)


@dataclass(frozen=True)
class GgufFile:
    """A GGUF file's metadata and tensors.

    Attributes:
        path: The file.
        metadata: Every key/value pair, values as Python scalars, strings or lists.
        tensors: The tensors in file order.
    """

    path: Path
    metadata: dict[str, Any]
    tensors: tuple[GgufTensor, ...]

    @property
    def architecture(self) -> str:
        """`general.architecture` ("llama", "qwen2", ...)."""
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelLoadError(f"{self.path}: GGUF metadata has no general.architecture")
        return arch

    def type_counts(self) -> dict[str, int]:
        """How many tensors of each GGML type the file holds."""
        counts: dict[str, int] = {}
        for tensor in self.tensors:
            counts[tensor.kind] = counts.get(tensor.kind, 0) + 1
        return counts


def open_gguf(path: Path) -> GgufFile:
    """Open a GGUF file: its header parsed, its tensor data memory-mapped (read when dequantized).

    The header is parsed here rather than by `gguf.GGUFReader`, which takes seconds
    over a large vocabulary (it builds an array per string); the layout is GGUF's
    published one (magic, version, counts, key/value pairs, tensor infos, aligned data).

    Raises:
        ModelLoadError: The file is truncated, corrupt, not GGUF, or holds a tensor
            type unknown to the `gguf` package (the message names the file and why).
    """
    path = Path(path)
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot read GGUF file {path}: {err}") from err
    try:
        return _parse(path, data)
    except _Truncated as err:
        raise ModelLoadError(f"cannot read GGUF file {path}: truncated ({err})") from err
    except (ValueError, KeyError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"cannot read GGUF file {path}: {err}") from err


class _Truncated(Exception):
    pass


class _Cursor:
    """Reads GGUF's little-endian values from a byte buffer, front to back."""

    def __init__(self, data: np.ndarray) -> None:
        self.buffer, self.at = memoryview(data), 0

    def take(self, size: int) -> memoryview:
        end = self.at + size
        if end > len(self.buffer):
            raise _Truncated(f"needs byte {end:,}, file has {len(self.buffer):,}")
        view, self.at = self.buffer[self.at:end], end
        return view

    def scalar(self, code: str) -> Any:
        return struct.unpack("<" + code, self.take(struct.calcsize(code)))[0]

    def string(self) -> str:
        return bytes(self.take(self.scalar("Q"))).decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("I"), self.scalar("Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item not in _SCALARS:
                raise ValueError(f"unsupported GGUF array item type {item}")
            dtype = np.dtype(_SCALARS[item][1])
            return np.frombuffer(self.take(dtype.itemsize * count), dtype=dtype).tolist()
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        value = self.scalar(_SCALARS[kind][0])
        return bool(value) if kind == _BOOL else value


_STRING, _ARRAY, _BOOL = 8, 9, 7
# GGUF value type -> (struct code, NumPy dtype)
_SCALARS = {0: ("B", "<u1"), 1: ("b", "<i1"), 2: ("H", "<u2"), 3: ("h", "<i2"), 4: ("I", "<u4"),
            5: ("i", "<i4"), 6: ("f", "<f4"), 7: ("?", "<u1"), 10: ("Q", "<u8"), 11: ("q", "<i8"),
            12: ("d", "<f8")}
_DEFAULT_ALIGNMENT = 32


def _parse(path: Path, data: np.ndarray) -> GgufFile:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    cursor = _Cursor(data)
    if bytes(cursor.take(4)) != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    version = cursor.scalar("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_values = cursor.scalar("Q"), cursor.scalar("Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_values):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name, n_dims = cursor.string(), cursor.scalar("I")
        dims = [cursor.scalar("Q") for _ in range(n_dims)]
        code, offset = cursor.scalar("I"), cursor.scalar("Q")
        try:
            kind = GGMLQuantizationType(code)
        except ValueError as err:
            raise ValueError(f"tensor {name} has unknown GGML type {code} "
                             "(a newer llama.cpp's type this codectx cannot convert)") from err
        infos.append((name, kind, tuple(reversed(dims)), offset))
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    start = -(-cursor.at // alignment) * alignment
    tensors = []
    for name, kind, shape, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        count = int(np.prod(shape)) if shape else 1
        nbytes = count // block * block_bytes
        begin = start + offset
        if begin + nbytes > len(data):
            raise _Truncated(f"tensor {name} ends at byte {begin + nbytes:,}, file has {len(data):,}")
        tensors.append(GgufTensor(name, kind.name, shape, nbytes, data[begin:begin + nbytes]))
    return GgufFile(path, metadata, tuple(tensors))
