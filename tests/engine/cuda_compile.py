"""Our CUDA kernels' device code compiled without a GPU: NVIDIA's runtime compiler (NVRTC, from its PyPI
wheel) on the sources MLX would build from our calls.

MLX's CUDA backend has no CPU build, so `mx.fast.cuda_kernel` is replaced by `Recorder` (a stand-in, named
as such: MLX's call is a thing we do not own and cannot run here). Each kernel's definition (name, header,
body, input and output names) and each launch's inputs, template and output dtypes are recorded, and the
launch returns zeros. `kernel_source` writes the whole kernel the way MLX's CUDA backend writes one: its
header, ours, then ``__global__ void name(const T* input, [Shape input_shape, Strides input_strides,
int input_ndim: where the body names them], ..., T* output, ...) { constexpr int ... = ...; using T = ...;
body }`` inside ``namespace mlx::core::cu``. MLX's own header (``mlx/backend/cuda/device/utils.cuh``,
compiled into MLX) is not in its wheel: `PRELUDE` stands in for the part our kernels use (the fixed-width
integer types, ``INFINITY``, ``Shape`` and ``Strides``); MLX's header also brings in cooperative groups,
which none of our kernels uses (its headers need more of CUDA's than the wheel holds): one that did would
fail here.
`compile_errors` compiles for the H200's architecture (sm_90).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

ARCH = "sm_90"
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
C_TYPES = {mx.bool_: "bool", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
           mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t",
           mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.float32: "float"}


@dataclass(frozen=True)
class Definition:
    """What `mx.fast.cuda_kernel` was given."""

    name: str
    source: str
    header: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


@dataclass
class Recorder:
    """Stands in for `mx.fast.cuda_kernel`: keeps each definition and each launch's (inputs' dtypes and ranks,
    template, output dtypes); a launch returns zeros of its outputs."""

    launches: list[tuple[Definition, tuple, tuple, tuple]] = field(default_factory=list)

    def __call__(self, *, name: str, input_names: list, output_names: list, source: str, header: str = "",
                 **_: Any) -> Any:
        definition = Definition(name, source, header, tuple(input_names), tuple(output_names))

        def launch(*, inputs: list, template: list = (), output_shapes: list, output_dtypes: list, **__: Any) -> list:
            self.launches.append((definition, tuple((a.dtype, a.ndim) for a in inputs), tuple(template),
                                  tuple(output_dtypes)))
            return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    def sources(self) -> dict[str, str]:
        """Each distinct kernel source launched, under a readable name (definition and template)."""
        out = {}
        for definition, inputs, template, outputs in self.launches:
            label = definition.name + "".join(f"_{str(v).split('.')[-1]}" for _, v in template)
            out.setdefault(kernel_source(definition, inputs, template, outputs), label)
        return {label: source for source, label in out.items()}


def record_kernels(factories: Any, recorder: Recorder | None = None) -> Recorder:
    """`recorder` (a fresh `Recorder` by default) as MLX's kernel call for the rest of this process, the CUDA check
    forced on and the kernels `factories` cached dropped (for scripts that only record: nothing is put back; tests
    use monkeypatch)."""
    from engine import cuda_backend

    recorder = Recorder() if recorder is None else recorder
    mx.fast.cuda_kernel = recorder
    cuda_backend.cuda_available = lambda: True
    for factory in factories:
        factory.cache_clear()
    return recorder


def graph_operations(*outputs: mx.array) -> list[str]:
    """The names of the operations in the graph of `outputs` (unevaluated), as `mx.export_to_dot` writes them: what
    a step replayed on the GPU launches, read on the CPU (`tests/engine/test_step_graph.py`, `scripts/step_graph.py`)."""
    with tempfile.TemporaryDirectory() as tmp:
        dot = Path(tmp) / "graph.dot"
        mx.export_to_dot(str(dot), *outputs)
        return re.findall(r'\[label ="(\w+)"', dot.read_text())


def kernel_source(definition: Definition, inputs: tuple, template: tuple, output_dtypes: tuple) -> str:
    """The whole kernel as MLX's CUDA backend writes it (module docstring), `PRELUDE` for MLX's header."""
    params = []
    for name, (dtype, ndim) in zip(definition.input_names, inputs):
        params.append(f"    const {C_TYPES[dtype]}* {name}")
        for suffix, kind in (("shape", "Shape"), ("strides", "Strides"), ("ndim", "int")):
            if ndim > 0 and f"{name}_{suffix}" in definition.source:
                params.append(f"    const __grid_constant__ {kind} {name}_{suffix}")
    params += [f"    {C_TYPES[dtype]}* {name}" for name, dtype in zip(definition.output_names, output_dtypes)]
    constants = []
    for name, value in template:
        if isinstance(value, bool):
            constants.append(f"  constexpr bool {name} = {'true' if value else 'false'};")
        elif isinstance(value, int):
            constants.append(f"  constexpr int {name} = {value};")
        else:
            constants.append(f"  using {name} = {C_TYPES[value]};")
    return (f"{PRELUDE}{definition.header}namespace mlx::core::cu {{\n\n"
            f"__global__ void {definition.name}(\n" + ",\n".join(params) + ") {\n" + "\n".join(constants)
            + f"\n\n{definition.source}\n}}\n\n}} // namespace mlx::core::cu\n")


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


@functools.lru_cache(maxsize=1)
def _nvrtc() -> tuple[Any, Path]:
    """libnvrtc and the CUDA headers' folder, from the wheels the dev extras install."""
    nvrtc, runtime = _package_dir("nvidia.cuda_nvrtc"), _package_dir("nvidia.cuda_runtime")
    if nvrtc is None or runtime is None:
        raise RuntimeError("NVRTC is missing: install the dev extras (pip install -e '.[dev]')")
    return ctypes.CDLL(str(next((nvrtc / "lib").glob("libnvrtc.so.*")))), runtime / "include"


def _compile(source: str, name: str, *extra: bytes) -> tuple[bool, str]:
    """(whether NVRTC compiled `source` for `ARCH`, its log)."""
    lib, include = _nvrtc()
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        options = [f"--gpu-architecture={ARCH}".encode(), b"-std=c++17", b"-I" + str(include).encode(), *extra]
        status = lib.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        return status == 0, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def cubin(source: str, name: str = "kernel.cu") -> bytes:
    """`source` compiled for `ARCH` by NVRTC: the cubin (machine code, which `cuobjdump -sass` reads)."""
    lib, include = _nvrtc()
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        options = [f"--gpu-architecture={ARCH}".encode(), b"-std=c++17", b"-I" + str(include).encode()]
        if lib.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options)) != 0:
            raise RuntimeError(f"{name} does not compile")
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(program, ctypes.byref(size))
        code = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(program, code)
        return code.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def compile_errors(source: str, name: str = "kernel.cu") -> str | None:
    """NVRTC's log when `source` does not compile for `ARCH` (None when it does)."""
    ok, log = _compile(source, name)
    return None if ok else log


def resources(source: str, name: str = "kernel.cu") -> dict[str, int]:
    """What the assembler reports for `source` compiled for `ARCH` (``--ptxas-options=-v``): registers a thread,
    stack frame and spill bytes."""
    ok, log = _compile(source, name, b"--ptxas-options=-v")
    if not ok:
        raise RuntimeError(log)
    found = {"registers": re.search(r"Used (\d+) registers", log),
             "stack": re.search(r"(\d+) bytes stack frame", log),
             "spill_stores": re.search(r"(\d+) bytes spill stores", log),
             "spill_loads": re.search(r"(\d+) bytes spill loads", log)}
    if not all(found.values()):
        raise RuntimeError(f"no resource usage in the assembler's log:\n{log}")
    return {key: int(match.group(1)) for key, match in found.items()}
