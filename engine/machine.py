"""What this machine offers a model: its memory and whether MLX runs on Apple's GPU.

Memory: `hw.memsize` (sysctl) on macOS; on Linux `MemTotal` in /proc/meminfo, lowered to the
cgroup's limit when the process runs in a container that has one; elsewhere the physical page
count. Metal is asked of MLX on macOS only (the Linux wheels have no Metal).
"""
from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

_GIB = 1024**3
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


@dataclass(frozen=True)
class Machine:
    """The facts a model choice depends on.

    Attributes:
        memory_bytes: Memory the process can use (None when it cannot be read).
        apple_silicon: macOS on arm64.
        metal: MLX runs on the GPU through Metal: weights stay quantised there; without it
            codectx runs float32 on the CPU (`engine.loaded_model.weight_dtype`).
        system: `platform.system()` ("Darwin", "Linux").
    """

    memory_bytes: int | None
    apple_silicon: bool
    metal: bool
    system: str = "Linux"

    def describe(self) -> str:
        """E.g. "16.0 GiB, Apple Silicon, Metal" or "23.4 GiB, Linux, CPU"."""
        memory = f"{self.memory_bytes / _GIB:.1f} GiB" if self.memory_bytes else "memory unknown"
        kind = "Apple Silicon" if self.apple_silicon else self.system
        return f"{memory}, {kind}, {'Metal' if self.metal else 'CPU'}"


def this_machine() -> Machine:
    """The machine codectx runs on."""
    system = platform.system()
    apple = system == "Darwin" and platform.machine() == "arm64"
    return Machine(total_memory(system), apple, apple and _metal_available(), system)


def total_memory(system: str | None = None) -> int | None:
    """Bytes of memory this process can use, or None when it cannot be read."""
    system = system or platform.system()
    if system == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True,
                                 timeout=5, check=True).stdout
            return int(out.strip())
        except (OSError, subprocess.SubprocessError, ValueError):
            return _pages()
    if system == "Linux":
        total = _meminfo_total() or _pages()
        limit = _cgroup_limit()
        return min(total, limit) if total and limit else total
    return _pages()


def _meminfo_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_limit() -> int | None:
    """A container's memory limit (cgroup v2, else v1); None when unlimited or absent."""
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "no limit"
            return int(text)
    return None


def _pages() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _metal_available() -> bool:
    try:
        import mlx.core as mx

        return bool(mx.metal.is_available())
    except (ImportError, AttributeError, RuntimeError):
        return False
