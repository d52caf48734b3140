"""Our CUDA kernels' device code compiled without a GPU: NVIDIA's runtime compiler (NVRTC, from its PyPI
wheel) on the sources MLX would build from our calls.

MLX's CUDA backend has no CPU build, so `mx.fast.cuda_kernel` is replaced by `Recorder` (a stand-in, named
as such: MLX's call is a thing we do not own and cannot run here). Each kernel's definition (name, header,
body, input and output names) and each launch's inputs, template and output dtypes are recorded, and the
launch returns zeros. `kernel_source` writes the whole kernel the way MLX's CUDA backend writes one
(`engine.cuda_kernel_cache.standalone_source`): its header, ours, then ``__global__ void
custom_kernel_<name><template>(const T* input, [Shape input_shape, Strides input_strides, int input_ndim: where
the body names them], ..., T* output, ...) { constexpr int ... = ...; using T = ...; body }`` inside
``namespace mlx::core::cu``. MLX's own header (``mlx/backend/cuda/device/utils.cuh``, compiled into MLX) is not in
its wheel: `PRELUDE` stands in for the part our kernels use (the fixed-width integer types, ``INFINITY``, ``Shape``
and ``Strides``); MLX's header also brings in cooperative groups, which none of our kernels uses (its headers need
more of CUDA's than the wheel holds): one that did would fail here. `PRELUDE`, the C types and the NVRTC loader are
`engine.cuda_kernel_cache`'s, which compiles the same sources for MLX's PTX cache on a GPU host.
`compile_errors` compiles for the H200's architecture (sm_90).
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx

from engine.cuda_kernel_cache import C_TYPES, PRELUDE, Definition, kernel_name, standalone_source
from engine.nvrtc import nvrtc_compile

__all__ = ["ARCH", "C_TYPES", "PRELUDE", "Definition", "Recorder", "compile_errors", "cubin", "graph_operations",
           "kernel_source", "record_kernels", "recorded", "resources"]
ARCH = "sm_90"


@dataclass
class Recorder:
    """Stands in for `mx.fast.cuda_kernel`: keeps each definition and each launch's (inputs' dtypes and ranks,
    template, output dtypes); a launch returns zeros of its outputs."""

    launches: list[tuple[Definition, tuple, tuple, tuple]] = field(default_factory=list)

    def __call__(self, *, name: str, input_names: list, output_names: list, source: str, header: str = "",
                 **_: Any) -> Any:
        definition = Definition(name=name, header=header, source=source, input_names=tuple(input_names),
                                output_names=tuple(output_names))

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


def recorded(monkeypatch: Any, factories: Any) -> Iterator[Recorder]:
    """A test fixture's body (``yield from recorded(monkeypatch, FACTORIES)``): `record_kernels` for the test, MLX's
    kernel call and the CUDA check put back after it by `monkeypatch`, and the caches `factories` dropped before and
    after (kernels or verdicts made outside the test are not the recorder's)."""
    from engine import cuda_backend

    monkeypatch.setattr(mx.fast, "cuda_kernel", getattr(mx.fast, "cuda_kernel", None), raising=False)
    monkeypatch.setattr(cuda_backend, "cuda_available", cuda_backend.cuda_available)
    yield record_kernels(factories)
    for factory in factories:
        factory.cache_clear()


def graph_operations(*outputs: mx.array) -> list[str]:
    """The names of the operations in the graph of `outputs` (unevaluated), as `mx.export_to_dot` writes them: what
    a step replayed on the GPU launches, read on the CPU (`tests/engine/test_step_graph.py`, `scripts/step_graph.py`)."""
    with tempfile.TemporaryDirectory() as tmp:
        dot = Path(tmp) / "graph.dot"
        mx.export_to_dot(str(dot), *outputs)
        return re.findall(r'\[label ="(\w+)"', dot.read_text())


def kernel_source(definition: Definition, inputs: tuple, template: tuple, output_dtypes: tuple) -> str:
    """The whole kernel as MLX's CUDA backend writes it (module docstring), `PRELUDE` for MLX's header."""
    return standalone_source(kernel_name(definition.name, template), definition.header, definition.source,
                             definition.input_names, inputs, definition.output_names, output_dtypes, template)


def _compile(source: str, name: str, *extra: str) -> tuple[bool, str]:
    """(whether NVRTC compiled `source` for `ARCH`, its log)."""
    result = nvrtc_compile(source, (f"--gpu-architecture={ARCH}", "-std=c++17", *extra), program_name=name)
    return result.ok, result.log


def cubin(source: str, name: str = "kernel.cu") -> bytes:
    """`source` compiled for `ARCH` by NVRTC: the cubin (machine code, which `cuobjdump -sass` reads)."""
    result = nvrtc_compile(source, (f"--gpu-architecture={ARCH}", "-std=c++17"), program_name=name)
    if not result.ok:
        raise RuntimeError(f"{name} does not compile")
    return result.cubin


def compile_errors(source: str, name: str = "kernel.cu") -> str | None:
    """NVRTC's log when `source` does not compile for `ARCH` (None when it does)."""
    ok, log = _compile(source, name)
    return None if ok else log


def resources(source: str, name: str = "kernel.cu") -> dict[str, int]:
    """What the assembler reports for `source` compiled for `ARCH` (``--ptxas-options=-v``): registers a thread,
    stack frame and spill bytes."""
    ok, log = _compile(source, name, "--ptxas-options=-v")
    if not ok:
        raise RuntimeError(log)
    found = {"registers": re.search(r"Used (\d+) registers", log),
             "stack": re.search(r"(\d+) bytes stack frame", log),
             "spill_stores": re.search(r"(\d+) bytes spill stores", log),
             "spill_loads": re.search(r"(\d+) bytes spill loads", log)}
    if not all(found.values()):
        raise RuntimeError(f"no resource usage in the assembler's log:\n{log}")
    return {key: int(match.group(1)) for key, match in found.items()}
