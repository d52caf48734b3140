"""NVIDIA's runtime compiler (NVRTC) and the driver's CUDA version, through ctypes: what `engine.cuda_kernel_cache`
compiles our kernels with, and what tests compile their device code with on a machine without a GPU.

libnvrtc is the one on the library path (on a GPU host, the toolkit's) or the nvidia-cuda-nvrtc wheel's (the dev
extras); CUDA's headers come from the nvidia-cuda-runtime wheel, $CUDA_HOME, $CUDA_PATH or /usr/local/cuda.
"""
from __future__ import annotations

import collections
import ctypes
import functools
import importlib.util
import os
from pathlib import Path
from typing import Iterable, Sequence


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:  # the parent package (``nvidia``) is not installed
        return None
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def _load_nvrtc() -> ctypes.CDLL:
    """libnvrtc on the library path (a GPU host's toolkit; the H100 hosts lent here have NVRTC 13.0 there, MLX 0.32.4
    links none by name), else the PyPI wheel's."""
    for soname in ("libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"):
        try:
            return ctypes.CDLL(soname)
        except OSError:
            pass
    wheel = _package_dir("nvidia.cuda_nvrtc")
    found = sorted((wheel / "lib").glob("libnvrtc.so.*")) if wheel else []
    if not found:
        raise RuntimeError("NVRTC not found (libnvrtc.so.12, or the wheel: pip install -e '.[dev]')")
    return ctypes.CDLL(str(found[0]))


def cuda_include() -> Path | None:
    """A folder with CUDA's headers (``cuda_bf16.h``): the nvidia-cuda-runtime wheel's, $CUDA_HOME's, $CUDA_PATH's or
    /usr/local/cuda's, the first that has them."""
    runtime = _package_dir("nvidia.cuda_runtime")
    candidates = [runtime / "include"] if runtime else []
    candidates += [Path(os.environ[name]) / "include" for name in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(name)]
    candidates.append(Path("/usr/local/cuda/include"))
    return next((path for path in candidates if (path / "cuda_bf16.h").is_file()), None)


@functools.lru_cache(maxsize=1)
def nvrtc() -> tuple[ctypes.CDLL, Path]:
    """libnvrtc and CUDA's headers' folder; RuntimeError if either is missing."""
    include = cuda_include()
    if include is None:
        raise RuntimeError("CUDA's headers (cuda_bf16.h) not found: install nvidia-cuda-runtime-cu12 or set CUDA_HOME")
    return _load_nvrtc(), include


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC `nvrtc` loads."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc()[0].nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def driver_version() -> tuple[int, int]:
    """(major, minor) of the CUDA version the GPU's driver supports (libcuda's ``cuDriverGetVersion``)."""
    version = ctypes.c_int()
    _check(ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    return version.value // 1000, version.value % 1000 // 10


Compiled = collections.namedtuple("Compiled", "ok log cubin lowered", defaults=(b"", ""))
"""What NVRTC made of a program: whether it compiled, its log, its cubin and lowered (mangled) name."""


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed (status {status})")


def nvrtc_compile(source: str, options: Iterable[str | bytes], name_expression: str | None = None,
                  program_name: str = "kernel.cu") -> Compiled:
    """`source` compiled by NVRTC with `options` (CUDA's headers' folder added); `name_expression`'s lowered name
    read back where given. A source that does not compile is a `Compiled` that is not ok, not an error."""
    (lib, include), program = nvrtc(), ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), program_name.encode(), 0, None, None),
           "nvrtcCreateProgram")
    try:
        if name_expression is not None:
            _check(lib.nvrtcAddNameExpression(program, name_expression.encode()), "nvrtcAddNameExpression")
        args = [o if isinstance(o, bytes) else o.encode() for o in (*options, f"--include-path={include}")]
        status = lib.nvrtcCompileProgram(program, len(args), (ctypes.c_char_p * len(args))(*args))
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(size.value + 1)
        _check(lib.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
        if status != 0:
            return Compiled(False, log.value.decode(errors="replace"))
        lowered = ctypes.c_char_p()
        if name_expression is not None:
            _check(lib.nvrtcGetLoweredName(program, name_expression.encode(), ctypes.byref(lowered)),
                   "nvrtcGetLoweredName")
        _check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "nvrtcGetCUBINSize")
        code = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetCUBIN(program, code), "nvrtcGetCUBIN")
        return Compiled(True, log.value.decode(errors="replace"), code.raw, (lowered.value or b"").decode())
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def compile_cubin(source: str, name_expression: str, arch: str, extra_options: Sequence[str] = ()) -> tuple[bytes, str]:
    """(cubin, lowered name of `name_expression`) of `source` compiled for `arch` (``sm_90a``) with MLX's options;
    RuntimeError with NVRTC's log if it does not compile or makes no cubin."""
    options = ("--device-as-default-execution-space", f"--gpu-architecture={arch}", *extra_options)
    result = nvrtc_compile(source, options, name_expression, name_expression.rpartition("::")[2] + ".cu")
    if not result.ok:
        raise RuntimeError(f"NVRTC could not compile {name_expression} for {arch}:\n{result.log}")
    if not result.cubin or not result.lowered:
        raise RuntimeError(f"NVRTC made no cubin or no lowered name for {name_expression} ({arch})")
    return result.cubin, result.lowered
