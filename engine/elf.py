"""Just enough ELF (64-bit, little-endian) to read a shared library's dynamic section.

Used by :mod:`engine.blas` to see which libraries a BLAS needs and to give a
bundled ``libgfortran`` copy its standard soname back.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from .errors import EngineError

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME = 0, 1, 5, 14


class ElfError(EngineError):
    """A file that is not a 64-bit little-endian ELF shared library we can read."""


def needed(path: Path) -> list[str]:
    """The ``DT_NEEDED`` names of the shared library at ``path``."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        dynamic = _Dynamic(data)
        return [dynamic.string(value) for tag, value in dynamic.entries if tag == _DT_NEEDED]


def soname(path: Path) -> str | None:
    """The ``DT_SONAME`` of the shared library at ``path``, or None when it has none."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        dynamic = _Dynamic(data)
        names = [dynamic.string(value) for tag, value in dynamic.entries if tag == _DT_SONAME]
        return names[0] if names else None


def with_soname(image: bytes, soname: str) -> bytes:
    """``image`` with its ``DT_SONAME`` replaced by ``soname`` (no longer than the old one).

    Raises:
        ElfError: not a readable ELF, no soname, or ``soname`` longer than the old one.
    """
    data = bytearray(image)
    dynamic = _Dynamic(data)
    offsets = [value for tag, value in dynamic.entries if tag == _DT_SONAME]
    if not offsets:
        raise ElfError("the library has no DT_SONAME")
    start = dynamic.string_offset(offsets[0])
    old = dynamic.string(offsets[0])
    new = soname.encode()
    if len(new) > len(old.encode()):
        raise ElfError(f"soname {soname!r} is longer than {old!r}")
    data[start : start + len(old)] = new.ljust(len(old), b"\0")
    return bytes(data)


class _Dynamic:
    """The dynamic entries and string table of an ELF image."""

    def __init__(self, data) -> None:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ElfError("not a 64-bit little-endian ELF file")
        self._data = data
        phoff = struct.unpack_from("<Q", data, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        self._loads: list[tuple[int, int, int]] = []
        dynamic: tuple[int, int] | None = None
        for index in range(phnum):
            kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
            if kind == _PT_LOAD:
                self._loads.append((vaddr, offset, filesz))
            elif kind == _PT_DYNAMIC:
                dynamic = (offset, filesz)
        if dynamic is None:
            raise ElfError("no dynamic section (not a shared library)")
        self.entries: list[tuple[int, int]] = []
        for position in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, value = struct.unpack_from("<qQ", data, position)
            if tag == _DT_NULL:
                break
            self.entries.append((tag, value))
        strtabs = [value for tag, value in self.entries if tag == _DT_STRTAB]
        if not strtabs:
            raise ElfError("no dynamic string table")
        self._strtab = self._file_offset(strtabs[0])

    def string_offset(self, index: int) -> int:
        return self._strtab + index

    def string(self, index: int) -> str:
        start = self.string_offset(index)
        end = self._data.find(b"\0", start)
        return bytes(self._data[start:end]).decode()

    def _file_offset(self, vaddr: int) -> int:
        for start, offset, size in self._loads:
            if start <= vaddr < start + size:
                return vaddr - start + offset
        raise ElfError(f"address {vaddr:#x} is in no loaded segment")
