"""Our CUDA kernels' compiled code written where MLX looks for it, so a process after the first loads it from disk.

Why: MLX's CUDA backend (0.32) compiles each kernel made with `mx.fast.cuda_kernel` with NVRTC the first time a
process launches it and keeps the result in memory only (for custom kernels it never writes its PTX cache), so every
process pays NVRTC again for each of our kernels: 6-12 s stalls in the middle of an answer. But before compiling a
module MLX always looks for ``<PTX folder>/<module name>.ptx`` (the kernels' mangled names in ``.txt`` beside it)
and loads what it finds. So on the first launch of each template `SeedingKernel` compiles the kernel itself (NVRTC
through ctypes, for the device's architecture) and writes it under the module name MLX will ask for. MLX compiles
when the graph is evaluated, after the launch: it finds the file in this process already, and later processes too.

The module name is the kernel's name and libstdc++'s ``std::hash<std::string>`` of the full text MLX writes from the
kernel's header, body, inputs (dtypes, and whether they have dimensions), outputs and template (`mlx_source` writes
the same text). MLX's own header is built into MLX: we compile `standalone_source`, the kernel byte for byte after
`PRELUDE`, which stands in for the part of that header our kernels use (a kernel needing more fails here).

What is trusted: only files under names that hash the whole text, written by MLX or by us, each atomically (a
rename; the names before the code, so MLX never finds code without its names). On a mismatch (an MLX whose text or
naming differs from ours, a signature we did not see) MLX finds no file under the name it computes and compiles the
kernel itself, as before: it costs the time saved, not correctness. What we compile computes what MLX's own build
computes: on an H100 (run gg, `bench/gpu_seeded_equal.py`) every logit row of a prefill, a question and 16 decode
steps over our kernels was bit for bit MLX's, seeding and loading the seeded files alike. We compile with the NVRTC
`engine.nvrtc` finds, which need not be MLX's: a cubin from an NVRTC newer than the driver's CUDA could fail MLX's
load, so seeding stays off there. Seeding runs only where MLX runs on CUDA, in MLX versions whose text and naming
were checked on a GPU (`VERIFIED_MLX`), with NVRTC and CUDA's headers found, unless CODECTX_CUDA_KERNEL_CACHE=0 (=1:
also under other versions); a failure while seeding turns it off for the process (one warning), the launch goes on.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import mlx.core as mx

from engine import mlx_cuda
from engine.archive_files import write_atomically
from engine.nvrtc import compile_cubin, driver_version, nvrtc_version

logger = logging.getLogger(__name__)

VERIFIED_MLX = frozenset({"0.32.4"})
"""MLX versions whose kernel text and module naming were checked against MLX on a GPU: only these are seeded."""
SWITCH = "CODECTX_CUDA_KERNEL_CACHE"
NAMESPACE = "mlx::core::cu::"
MAX_FILE_NAME = 245  # MLX splits a longer module name into folders of this many characters
DEFAULT_HEADER = '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'  # MLX's
PRELUDE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INFINITY (__int_as_float(0x7f800000))
namespace mlx::core::cu {
template <typename T, int N>
struct StandInArray {
  T values[N];
  __device__ const T& operator[](int i) const { return values[i]; }
  __device__ T& operator[](int i) { return values[i]; }
};
using Shape = StandInArray<int32_t, 10>;
using Strides = StandInArray<int64_t, 10>;
}  // namespace mlx::core::cu
"""
"""Stands in for MLX's header (not in its wheel): the part our kernels use. ``Shape`` and ``Strides`` are laid out as
MLX's (``cuda::std::array`` of 10 int32 / int64), so a kernel compiled against them takes MLX's arguments."""
C_TYPES = {mx.bool_: "bool", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
           mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t",
           mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.float32: "float", mx.float64: "double"}
"""Each dtype's C type in a kernel's text (MLX's ``dtype_to_cuda_type``)."""
TYPE_STRINGS = {**C_TYPES, mx.float16: "float16_t", mx.bfloat16: "bfloat16_t", mx.complex64: "complex64_t"}
"""Each dtype's name in a kernel's name (MLX's ``get_type_string``)."""


@dataclass(frozen=True)
class Definition:
    """What `mx.fast.cuda_kernel` was given (the name with our digest, `engine.cuda_backend.kernel`)."""

    name: str
    header: str
    source: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


def _template_suffix(value: Any) -> str:
    if isinstance(value, bool):  # before int: a bool is an int in Python, not in MLX's binding
        return "_t" if value else "_f"
    return f"_{value}" if isinstance(value, int) else "_" + TYPE_STRINGS[value]


def kernel_name(name: str, template: Iterable[tuple[str, Any]]) -> str:
    """The ``__global__`` function MLX names for kernel `name` launched with `template`."""
    return "custom_kernel_" + name + "".join(_template_suffix(value) for _, value in template)


def input_signature(inputs: Iterable[Any]) -> tuple[tuple[mx.Dtype, int], ...]:
    """(dtype, ndim) of each input as MLX sees it: arrays as they are, Python scalars as MLX's binding converts them
    (bool, int32, float32; no dimensions); (dtype, ndim) pairs pass through."""
    arrays = (value if isinstance(value, (mx.array, tuple)) else mx.array(value) for value in inputs)
    return tuple((a[0], int(a[1])) if isinstance(a, tuple) else (a.dtype, a.ndim) for a in arrays)


def _kernel_text(kernel: str, body: str, input_names: Sequence[str], inputs: Iterable[Any],
                 output_names: Sequence[str], output_dtypes: Sequence[mx.Dtype], template: Sequence) -> str:
    """The kernel's declaration and body as MLX writes them, the part `mlx_source` and `standalone_source` share."""
    parts = [f"__global__ void {kernel}(\n"]
    for name, (dtype, ndim) in zip(input_names, input_signature(inputs)):
        parts.append(f"    const {C_TYPES[dtype]}* {name},\n")
        if ndim > 0:  # MLX passes an input's shape, strides or rank where the body names them
            parts += [f"    const __grid_constant__ {kind} {name}_{suffix},\n"
                      for suffix, kind in (("shape", "Shape"), ("strides", "Strides"), ("ndim", "int"))
                      if f"{name}_{suffix}" in body]
    last = len(output_names) - 1
    parts += [f"    {C_TYPES[dtype]}* {name}" + (",\n" if i < last else ") {\n")
              for i, (name, dtype) in enumerate(zip(output_names, output_dtypes))]
    parts += [f"  constexpr bool {name} = {str(value).lower()};\n" if isinstance(value, bool)
              else f"  constexpr int {name} = {value};\n" if isinstance(value, int)
              else f"  using {name} = {C_TYPES[value]};\n" for name, value in template] + (["\n"] if template else [])
    return "".join(parts) + body + "\n}\n\n} // namespace mlx::core::cu\n"


def mlx_source(kernel: str, header: str, body: str, input_names: Sequence[str], inputs: Iterable[Any],
               output_names: Sequence[str], output_dtypes: Sequence[mx.Dtype], template: Sequence) -> str:
    """The full text MLX compiles for `kernel` (`kernel_name`) and hashes into its module name."""
    return (DEFAULT_HEADER + header + "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
            + _kernel_text(kernel, body, input_names, inputs, output_names, output_dtypes, template))


def standalone_source(kernel: str, header: str, body: str, input_names: Sequence[str], inputs: Iterable[Any],
                      output_names: Sequence[str], output_dtypes: Sequence[mx.Dtype], template: Sequence) -> str:
    """What we compile in place of `mlx_source`: `PRELUDE` for MLX's header, no cooperative groups (none of our
    kernels uses them); the kernel's declaration and body are MLX's, byte for byte."""
    return (PRELUDE + header + "namespace mlx::core::cu {\n\n"
            + _kernel_text(kernel, body, input_names, inputs, output_names, output_dtypes, template))


@functools.lru_cache(maxsize=1)
def _hash_bytes() -> Any:
    function = ctypes.CDLL("libstdc++.so.6")._ZSt11_Hash_bytesPKvmm
    function.restype = ctypes.c_size_t
    function.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]
    return function


def std_hash(data: bytes) -> int:
    """libstdc++'s ``std::hash<std::string>`` of `data` (its ``_Hash_bytes`` with the library's seed)."""
    return _hash_bytes()(data, len(data), 0xC70F6907)


def module_name(kernel: str, mlx_text: str) -> str:
    """The name MLX caches the module of `kernel` under: the kernel's name and the hash of its full text."""
    return f"{kernel}_{std_hash(mlx_text.encode()):x}"


def ptx_folder() -> Path:
    """MLX's PTX folder: $MLX_PTX_CACHE_DIR, else ``<temp>/mlx/<version>/ptx`` (libstdc++'s temp: $TMPDIR, $TMP, $TEMP
    or $TEMPDIR, the first set, else /tmp). RuntimeError where MLX has none (the variable empty, no temp folder)."""
    folder = os.environ.get("MLX_PTX_CACHE_DIR")
    if folder is not None:
        if not folder:
            raise RuntimeError("MLX_PTX_CACHE_DIR is empty: MLX keeps no PTX cache")
        return Path(folder).absolute()
    temp = next((os.environ[name] for name in ("TMPDIR", "TMP", "TEMP", "TEMPDIR") if name in os.environ), "/tmp")
    if not temp or not Path(temp).is_dir():
        raise RuntimeError(f"the temporary folder {temp!r} is not a folder: MLX keeps no PTX cache")
    return Path(temp).absolute() / "mlx" / mx.__version__ / "ptx"


def module_paths(folder: Path, module: str) -> tuple[Path, Path]:
    """The .ptx and .txt files MLX reads for `module`: a name over 245 characters is cut into folders of 245."""
    cut = (len(module) - 1) // MAX_FILE_NAME * MAX_FILE_NAME  # the last part keeps 1 to 245 characters
    base, last = folder.joinpath(*(module[i:i + MAX_FILE_NAME] for i in range(0, cut, MAX_FILE_NAME))), module[cut:]
    return base / f"{last}.ptx", base / f"{last}.txt"


class KernelSeeder:
    """Writes a kernel launch's compiled code into MLX's PTX folder `folder`, compiled for `arch` (``sm_90a``)."""

    def __init__(self, folder: Path, arch: str, extra_options: Sequence[str] = ()) -> None:
        self.folder, self.arch, self.extra_options = Path(folder), arch, tuple(extra_options)

    def seed(self, definition: Definition, inputs: Iterable[Any], template: Iterable[tuple[str, Any]],
             output_dtypes: Sequence[mx.Dtype]) -> bool:
        """Whether the launch's module was written (False: its file is there already); errors propagate, unwritten."""
        return self.seed_as(definition, definition, inputs, template, output_dtypes)

    def seed_as(self, named: Definition, compiled: Definition, inputs: Iterable[Any],
                template: Iterable[tuple[str, Any]], output_dtypes: Sequence[mx.Dtype]) -> bool:
        """`seed`, the module named from `named`'s text but compiled from `compiled`'s (the same kernel, but for a
        check on a GPU that MLX runs what it finds: bench/gpu_kernel_cache.py)."""
        template, signature, outputs = tuple(template), input_signature(inputs), tuple(output_dtypes)
        kernel = kernel_name(named.name, template)
        ptx, txt = module_paths(self.folder, module_name(kernel, mlx_source(
            kernel, named.header, named.source, named.input_names, signature, named.output_names, outputs, template)))
        if ptx.exists():
            return False
        source = standalone_source(kernel, compiled.header, compiled.source, compiled.input_names, signature,
                                   compiled.output_names, outputs, template)
        code, lowered = compile_cubin(source, NAMESPACE + kernel, self.arch, self.extra_options)
        ptx.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(txt, f"{NAMESPACE}{kernel}\t{lowered}\n".encode())  # the names first: MLX looks for the .ptx
        write_atomically(ptx, code)
        return True


_off_reason: str | None = None  # set once seeding failed: off for the rest of the process


def _turn_off(reason: str) -> None:
    global _off_reason
    _off_reason = reason
    logger.warning("our CUDA kernels are no longer written to MLX's PTX cache in this process: %s", reason)


class SeedingKernel:
    """`mx.fast.cuda_kernel`'s kernel, seeding MLX's PTX folder on the first launch of each template."""

    def __init__(self, kernel: Any, definition: Definition, seeder: Any) -> None:
        self._kernel, self._definition, self._seeder, self._seen = kernel, definition, seeder, set()

    def __call__(self, **kw: Any) -> Any:  # on every launch: kept to a tuple and a set lookup
        template = kw.get("template")
        key = tuple(template) if template else ()
        if key not in self._seen:
            self._seen.add(key)
            if _off_reason is None:
                try:
                    self._seeder.seed(self._definition, kw["inputs"], key, kw["output_dtypes"])
                except Exception as error:  # seeding only saves time: never let it stop a launch
                    _turn_off(f"{self._definition.name}: {type(error).__name__}: {error}")
        return self._kernel(**kw)


def device_arch() -> str:
    """The GPU's architecture as MLX compiles for it (``sm_90a``: the ``a`` from compute capability 9 on)."""
    info = mx.device_info()
    major, minor = int(info["compute_capability_major"]), int(info["compute_capability_minor"])
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


@functools.lru_cache(maxsize=1)
def _seeder() -> KernelSeeder | None:
    """This process's seeder, or None where seeding is off (why: logged once)."""
    if os.environ.get(SWITCH) == "0" or not mlx_cuda.on_cuda():
        return None
    try:  # "1" seeds under an MLX whose naming was not checked (the check itself: bench/gpu_kernel_cache.py)
        if mx.__version__ not in VERIFIED_MLX and os.environ.get(SWITCH) != "1":
            raise RuntimeError(f"MLX {mx.__version__}: its kernel naming was not checked (checked: "
                               f"{', '.join(sorted(VERIFIED_MLX))})")
        compiler, driver = nvrtc_version(), driver_version()
        if compiler < (11, 8):  # MLX builds PTX, not a cubin, with an older NVRTC
            raise RuntimeError(f"NVRTC {compiler} is older than 11.8")
        if compiler > driver:  # its cubin could be one the driver cannot load: MLX would fail
            raise RuntimeError(f"NVRTC {compiler} is newer than the driver's CUDA {driver}")
        return KernelSeeder(ptx_folder(), device_arch())
    except (RuntimeError, OSError, KeyError, TypeError, ValueError) as error:
        logger.info("our CUDA kernels are not written to MLX's PTX cache: %s", error)
        return None


def enabled() -> bool:
    """Whether our kernels' compiled code is written to MLX's PTX cache in this process."""
    return _off_reason is None and _seeder() is not None


def wrap(kernel_object: Any, name: str, source: str, header: str, input_names: Sequence[str],
         output_names: Sequence[str]) -> Any:
    """`kernel_object` (what `mx.fast.cuda_kernel` returned for these arguments) as a `SeedingKernel` where seeding
    is on, else unchanged."""
    if not enabled():
        return kernel_object
    definition = Definition(name, header, source, tuple(input_names), tuple(output_names))
    return SeedingKernel(kernel_object, definition, _seeder())
