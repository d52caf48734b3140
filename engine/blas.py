"""Put MLX's CPU backend on an optimized BLAS (Linux).

The ``mlx[cpu]`` wheel links a bundled *reference* BLAS (``mlx_cpu.libs/libblas-*``),
which multiplies matrices at a few GFLOP/s. ``libmlx.so`` takes ``cblas_sgemm`` by
name, so a library exporting the standard CBLAS symbols that is loaded with
``RTLD_GLOBAL`` *before* ``mlx.core`` is imported comes first in the dynamic
linker's global scope and interposes the reference one.

The default library is OpenBLAS from the PyPI package ``cmeel-openblas`` (a
dependency on Linux x86_64). It needs ``libgfortran.so.5``, which a bare machine
may lack; the ``mlx_cpu`` wheel bundles one under a renamed soname, so a copy
whose soname is set back to ``libgfortran.so.5`` is kept in the codectx home
(``<home>/blas/<hash>/``) and loaded first.

Preloading is an explicit start-up step, once per process and before
``mlx.core`` is imported: the server's `start_backend`, the CLI commands that
load models, the benchmarks and the test configuration call :func:`preload`
with the ``compute.blas`` / ``compute.blasThreads`` settings (or their flags).
Importing this module (or `engine`) does nothing by itself.

This module must not import MLX.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import elf, mlx_env
from .paths import codectx_home

logger = logging.getLogger(__name__)

_MAX_DEFAULT_THREADS = 8
_OFF = frozenset({"off", "0", "none", "reference"})
_GFORTRAN_SONAME = "libgfortran.so.5"


@dataclass
class BlasState:
    """What :func:`preload` did; reported by :func:`describe` and ``codectx doctor``."""

    library: str | None = None
    source: str = "not attempted"
    threads: int | None = None
    gfortran: str | None = None
    interposed: bool = False
    mlx_imported_first: bool = False
    choice: str = "auto"
    notes: list[str] = field(default_factory=list)


_state: BlasState | None = None
_handles: list[ctypes.CDLL] = []  # keep loaded libraries alive for the process


def preload(choice: str = "auto", threads: int = 0) -> str | None:
    """Load an optimized CBLAS globally so that MLX uses it; never raises.

    The first call decides for the process (the dynamic linker's choice lasts);
    a later call with other arguments changes nothing and says so in the log.
    Every call also sets MLX's start-up settings the user left unset (`engine.mlx_env`).

    Args:
        choice: ``auto`` (cmeel-openblas, else a system OpenBLAS), ``off`` (keep
            MLX's bundled reference BLAS), or the path of a shared library that
            exports ``cblas_sgemm`` (e.g. MKL's ``libmkl_rt.so``).
        threads: BLAS threads; 0 uses the usable cores, at most 8.

    Returns:
        The path of the loaded library, or None when MLX keeps its bundled BLAS
        (disabled, not Linux, nothing found, or loading failed; see :func:`describe`).
    """
    global _state
    mlx_env.apply()  # MLX's own start-up settings, read once like the BLAS
    choice = (choice or "auto").strip()
    if _state is None:
        _state = BlasState(choice=choice)
        try:
            _preload_into(_state, threads)
        except Exception as err:  # a BLAS problem must never stop the engine
            _state.library, _state.interposed = None, False
            _state.notes.append(f"preload failed: {err}")
            logger.warning("optimized BLAS not loaded, MLX keeps its reference BLAS: %s", err)
    elif choice != _state.choice or (threads and threads != _state.threads):
        logger.info("BLAS already chosen at start-up (%s, %s threads); %r with %d threads needs a restart",
                    _state.choice, _state.threads, choice, threads)
    return _state.library


def in_use() -> str:
    """The BLAS MLX's matmuls run on, as a short stable name (part of the compute path).

    ``reference`` unless :func:`preload` interposed a library, else that library's file name.
    """
    if _state is None or not _state.interposed or _state.library is None:
        return "reference"
    return Path(_state.library).name


def describe(measure: bool = False) -> dict:
    """Report which BLAS MLX uses and how it was chosen (does not preload).

    Args:
        measure: also time a 512x512 float32 matmul through ``mx.matmul`` on the
            CPU (imports MLX; ~0.1 s with an optimized BLAS, longer without).

    Returns:
        A dict with ``library``, ``source`` ("not attempted" before :func:`preload`),
        ``threads``, ``gfortran``, ``interposed`` (the global ``cblas_sgemm`` is
        the loaded library's), ``mlx_imported_first``, ``choice``, ``notes`` and,
        when measured, ``sgemm_gflops``.
    """
    report = asdict(_state if _state is not None else BlasState())
    if measure:
        report["sgemm_gflops"] = measure_sgemm_gflops()
    return report


def measure_sgemm_gflops(n: int = 512, repeats: int = 5) -> float:
    """GFLOP/s of an ``n``x``n`` float32 matmul through MLX on the CPU (best of ``repeats``)."""
    import mlx.core as mx

    a = mx.random.normal((n, n), stream=mx.cpu)
    b = mx.random.normal((n, n), stream=mx.cpu)
    mx.eval(mx.matmul(a, b, stream=mx.cpu))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(mx.matmul(a, b, stream=mx.cpu))
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def _preload_into(state: BlasState, threads: int) -> None:
    choice = state.choice
    state.mlx_imported_first = "mlx.core" in sys.modules
    if choice.lower() in _OFF:
        state.source = f"disabled (compute.blas={choice})"
        return
    if not sys.platform.startswith("linux"):
        state.source = "not needed on this platform (MLX uses the system BLAS)"
        return
    if choice.lower() not in {"", "auto"}:
        path, state.source = Path(choice).expanduser(), "compute.blas"
    else:
        path, state.source = _find_default(state)
        if path is None:
            return
    if state.mlx_imported_first:
        state.notes.append("mlx.core was imported before preload(); calls made before may be bound")
    _load(path, state, threads)


def _find_default(state: BlasState) -> tuple[Path | None, str]:
    """The cmeel-openblas library when installed, else a system OpenBLAS."""
    try:
        dist = importlib.metadata.distribution("cmeel-openblas")
        path = Path(dist.locate_file("cmeel.prefix/lib/libopenblas.so.0"))
        if path.exists():
            return path, "cmeel-openblas (PyPI)"
        state.notes.append(f"cmeel-openblas installed but {path} is missing")
    except importlib.metadata.PackageNotFoundError:
        state.notes.append("cmeel-openblas not installed")
    import ctypes.util  # lazily: it imports subprocess and friends

    system = ctypes.util.find_library("openblas")
    if system:
        return Path(system), "system OpenBLAS"
    state.source = "none found: MLX keeps its reference BLAS"
    state.notes.append("install cmeel-openblas (pip) or libopenblas0-pthread (apt) for ~50x faster matmuls")
    return None, state.source


def _load(path: Path, state: BlasState, threads: int) -> None:
    if "openblas" in path.name and _needs_gfortran(path):
        state.gfortran = _load_gfortran(state)
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    _handles.append(lib)
    state.library = str(path)
    state.threads = _set_threads(lib, threads)
    state.interposed = _global_symbol_is(lib, "cblas_sgemm")
    if not state.interposed:
        state.notes.append("cblas_sgemm in the global scope is not the loaded library's")
    logger.info("BLAS for MLX: %s (%s, %s threads)", path, state.source, state.threads)


def _needs_gfortran(path: Path) -> bool:
    try:
        return _GFORTRAN_SONAME in elf.needed(path)
    except elf.ElfError:
        return False


def _load_gfortran(state: BlasState) -> str:
    """Make ``libgfortran.so.5`` resolvable: the system's, else MLX's bundled copy."""
    try:
        ctypes.CDLL(_GFORTRAN_SONAME, mode=ctypes.RTLD_GLOBAL)
        return _GFORTRAN_SONAME + " (system)"
    except OSError:
        pass
    libs = Path(importlib.metadata.distribution("mlx-cpu").locate_file("mlx_cpu.libs"))
    bundled = sorted(libs.glob("libgfortran-*.so*"))
    if not bundled:
        raise FileNotFoundError(f"no libgfortran.so.5 on the system nor in {libs}")
    # Its renamed dependency (libquadmath-<hash>) is found by soname once loaded.
    for dep in sorted(libs.glob("libquadmath-*.so*")):
        _handles.append(ctypes.CDLL(str(dep), mode=ctypes.RTLD_GLOBAL))
    copy = _soname_copy(bundled[0])
    _handles.append(ctypes.CDLL(str(copy), mode=ctypes.RTLD_GLOBAL))
    state.notes.append(f"libgfortran from {bundled[0].name} with soname {_GFORTRAN_SONAME}")
    return str(copy)


def _soname_copy(source: Path) -> Path:
    """A cached copy of ``source`` whose soname is ``libgfortran.so.5`` (atomic write). A copy of another
    size than ``source`` (the rewrite keeps the size; empty or short after a power loss: a rename without
    fsync) is written again."""
    data = source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    target = codectx_home() / "blas" / digest / _GFORTRAN_SONAME
    try:
        if target.stat().st_size == len(data):
            return target
    except OSError:
        pass
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        partial.write_bytes(elf.with_soname(data, _GFORTRAN_SONAME))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def thread_count(configured: int = 0) -> int:
    """BLAS threads to use: `configured` when positive, else the usable cores (at most 8)."""
    if configured > 0:
        return configured
    return min(len(os.sched_getaffinity(0)), _MAX_DEFAULT_THREADS)


def threads_in_use() -> int:
    """The thread count :func:`preload` gave MLX's BLAS, else the default (NumPy's pool follows it)."""
    return _state.threads if _state is not None and _state.threads else thread_count()


_THREAD_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
                   "openblas_set_num_threads64_", "MKL_Set_Num_Threads")


def set_threads(lib: ctypes.CDLL, threads: int) -> bool:
    """Set the thread count of a loaded BLAS (OpenBLAS, NumPy's bundled OpenBLAS, MKL)."""
    for setter in _THREAD_SETTERS:
        if hasattr(lib, setter):
            getattr(lib, setter)(ctypes.c_int(threads))
            return True
    return False


def _set_threads(lib: ctypes.CDLL, configured: int) -> int | None:
    threads = thread_count(configured)
    return threads if set_threads(lib, threads) else None


def _global_symbol_is(lib: ctypes.CDLL, name: str) -> bool:
    """Whether the process's global lookup of ``name`` finds ``lib``'s definition."""
    own = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    found = ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value
    return own is not None and own == found
