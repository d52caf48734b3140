"""engine/cuda_kernel_cache.py on a machine without a GPU: MLX's kernel text and module naming written as MLX 0.32
writes them (checked against hand-written text), our kernels compiled into a PTX folder by the real NVRTC (the dev
extras' wheel), and the wrapper that seeds on a kernel's first launch, which must never stop a launch."""
from __future__ import annotations

import logging
import re
import string

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine import cuda_qmv, mlx_cuda
from engine import cuda_kernel_cache as cache
from tests.engine.cuda_compile import PRELUDE, recorded

FACTORIES = (cuda_qmv._kernel, cuda_qmv._three_kernel, cuda_qmv._glu_kernel)
BODY = ("  // s_shape: named, not passed (s has no dimensions)\n"
        "  if (a_shape[0] > 0 && a_strides[1] > 0) out[0] = T(s[0] * N);\n  flags[0] = B;")
PROBE = ("probe", "#define PROBE 1\n", BODY, ("a", "s"), ("out", "flags"))
TEMPLATE = [("N", 4), ("T", mx.bfloat16), ("B", True)]
EXPECTED = """
#include "mlx/backend/cuda/device/utils.cuh"

#include <cooperative_groups.h>

#define PROBE 1
namespace mlx::core::cu {

namespace cg = cooperative_groups;

__global__ void custom_kernel_probe_4_bfloat16_t_t(
    const __half* a,
    const __grid_constant__ Shape a_shape,
    const __grid_constant__ Strides a_strides,
    const int32_t* s,
    __nv_bfloat16* out,
    bool* flags) {
  constexpr int N = 4;
  using T = __nv_bfloat16;
  constexpr bool B = true;

  // s_shape: named, not passed (s has no dimensions)
  if (a_shape[0] > 0 && a_strides[1] > 0) out[0] = T(s[0] * N);
  flags[0] = B;
}

} // namespace mlx::core::cu
"""


def probe_sources(template=TEMPLATE) -> tuple[str, str, str]:
    """(kernel name, MLX's text, the standalone text) of the probe kernel: a 2-D float16 input whose shape and
    strides the body names, a Python int (an int32 scalar to MLX), a bfloat16 and a bool output."""
    name, header, body, inputs, outputs = PROBE
    kernel = cache.kernel_name(name, template)
    args = (kernel, header, body, inputs, [mx.zeros((2, 3), dtype=mx.float16), 3], outputs,
            [mx.bfloat16, mx.bool_], template)
    return kernel, cache.mlx_source(*args), cache.standalone_source(*args)


def test_the_kernel_text_is_mlxs_byte_for_byte():
    kernel, text, standalone = probe_sources()
    assert kernel == "custom_kernel_probe_4_bfloat16_t_t"
    assert text == EXPECTED
    declaration = EXPECTED.index("__global__")
    assert standalone == PRELUDE + "#define PROBE 1\nnamespace mlx::core::cu {\n\n" + EXPECTED[declaration:]
    assert "cooperative" not in standalone


def test_a_kernel_without_a_template_has_no_constants_and_no_blank_line():
    kernel, text, _ = probe_sources(template=[])
    assert kernel == "custom_kernel_probe"
    assert "    bool* flags) {\n  // s_shape" in text
    assert cache.kernel_name("k", [("F", False), ("D", mx.float32), ("G", 128), ("U", mx.uint32)]) == \
        "custom_kernel_k_f_float_128_uint32_t"


def test_std_hash_is_libstdcxx_and_names_the_module_by_the_whole_text():
    assert cache.std_hash(b"hello") == 0x26553298FDBE39C8  # std::hash<std::string>{}("hello") from a g++ build
    assert cache.std_hash(b"hello") == cache.std_hash(b"hello") != cache.std_hash(b"hellp")
    kernel, text, _ = probe_sources()
    name = cache.module_name(kernel, text)
    assert re.fullmatch(r"custom_kernel_probe_4_bfloat16_t_t_[0-9a-f]+", name)
    assert name == f"{kernel}_{cache.std_hash(text.encode()):x}"
    assert cache.module_name(kernel, text + " ") != name


def test_long_module_names_are_cut_into_folders_of_245(tmp_path):
    name = "".join(string.ascii_letters[i % 52] for i in range(600))
    ptx, txt = cache.module_paths(tmp_path, name)
    assert ptx == tmp_path / name[:245] / name[245:490] / f"{name[490:]}.ptx"
    assert txt == ptx.with_suffix(".txt")
    assert cache.module_paths(tmp_path, name[:245])[0] == tmp_path / f"{name[:245]}.ptx"
    assert cache.module_paths(tmp_path, name[:246])[0] == tmp_path / name[:245] / f"{name[245]}.ptx"


def test_the_ptx_folder_is_mlxs(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    assert cache.ptx_folder() == tmp_path / "ptx"
    monkeypatch.delenv("MLX_PTX_CACHE_DIR")
    for name in ("TMP", "TEMP", "TEMPDIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert cache.ptx_folder() == tmp_path / "mlx" / mx.__version__ / "ptx"
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", "")
    with pytest.raises(RuntimeError, match="empty"):
        cache.ptx_folder()


@pytest.fixture
def recorder(monkeypatch):
    """MLX's kernel call recorded (tests/engine/cuda_compile.py) for `FACTORIES`' kernels, put back after."""
    yield from recorded(monkeypatch, FACTORIES)


def quantized(k: int, n: int) -> nn.QuantizedLinear:
    linear = nn.QuantizedLinear(k, n, bias=False, group_size=64, bits=4)
    linear.set_dtype(mx.bfloat16)
    return linear


def test_the_seeder_writes_our_kernels_where_mlx_reads_them(recorder, tmp_path):
    x = mx.zeros((1, 1, 512), dtype=mx.bfloat16)
    out = quantized(512, 256)
    cuda_qmv.qmv(x, out.weight, out.scales, out.biases, bits=4, group_size=64)
    cuda_qmv.three(x, (quantized(512, 256), quantized(512, 128), quantized(512, 128)))
    assert len(recorder.launches) == 2
    seeder = cache.KernelSeeder(tmp_path, "sm_90a")
    for definition, inputs, template, outputs in recorder.launches:
        kernel = cache.kernel_name(definition.name, template)
        text = cache.mlx_source(kernel, definition.header, definition.source, definition.input_names, inputs,
                                definition.output_names, outputs, template)
        ptx, txt = cache.module_paths(tmp_path, cache.module_name(kernel, text))
        assert seeder.seed(definition, inputs, template, outputs) is True
        assert ptx.read_bytes()[:4] == b"\x7fELF"
        name, mangled = txt.read_text().rstrip("\n").split("\t")
        assert txt.read_text().count("\n") == 1 and name == "mlx::core::cu::" + kernel
        assert mangled.startswith("_Z") and kernel in mangled
        before = {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*")}
        assert seeder.seed(definition, inputs, template, outputs) is False
        assert {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*")} == before
    assert sorted(path.suffix for path in tmp_path.iterdir()) == [".ptx", ".ptx", ".txt", ".txt"]


def test_a_kernel_that_does_not_compile_writes_nothing(tmp_path):
    name, header, body, inputs, outputs = PROBE
    definition = cache.Definition(name, header, body + "\n  undeclared_name = 1;", inputs, outputs)
    seeder = cache.KernelSeeder(tmp_path / "ptx", "sm_90a")
    with pytest.raises(RuntimeError, match="undeclared_name"):
        seeder.seed(definition, [mx.zeros((2, 3), dtype=mx.float16), 3], TEMPLATE, [mx.bfloat16, mx.bool_])
    assert not (tmp_path / "ptx").exists()


class StandIn:
    """Stands in for MLX's kernel object and for a seeder: records what it was called with."""

    def __init__(self, fail: bool = False) -> None:
        self.calls, self.seeds, self.fail = [], [], fail

    def __call__(self, **kw):
        self.calls.append(kw)
        return ["result", len(self.calls)]

    def seed(self, definition, inputs, template, output_dtypes) -> bool:
        self.seeds.append(template)
        if self.fail:
            raise RuntimeError("no NVRTC today")
        return True


def launch(kernel, template) -> list:
    return kernel(inputs=[mx.zeros((2,))], template=template, output_shapes=[(2,)], output_dtypes=[mx.float32],
                  grid=(2, 1, 1), threadgroup=(2, 1, 1))


def test_the_seeding_kernel_seeds_once_per_template_and_always_launches(monkeypatch):
    monkeypatch.setattr(cache, "_off_reason", None)
    kernel, seeder = StandIn(), StandIn()
    wrapped = cache.SeedingKernel(kernel, cache.Definition("probe", "", BODY, ("x",), ("y",)), seeder)
    results = [launch(wrapped, t) for t in ([("N", 1)], [("N", 1)], [("N", 2)], [("N", 1)])]
    assert results == [["result", 1], ["result", 2], ["result", 3], ["result", 4]]
    assert seeder.seeds == [(("N", 1),), (("N", 2),)]
    assert [call["template"] for call in kernel.calls] == [[("N", 1)], [("N", 1)], [("N", 2)], [("N", 1)]]


def test_a_seeding_failure_turns_seeding_off_and_the_launch_goes_on(monkeypatch, caplog):
    monkeypatch.setattr(cache, "_off_reason", None)
    kernel, seeder = StandIn(), StandIn(fail=True)
    wrapped = cache.SeedingKernel(kernel, cache.Definition("probe", "", BODY, ("x",), ("y",)), seeder)
    with caplog.at_level(logging.WARNING, logger=cache.__name__):
        assert launch(wrapped, [("N", 1)]) == ["result", 1]
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "no NVRTC today" in caplog.text
    assert cache._off_reason is not None and not cache.enabled()
    assert launch(wrapped, [("N", 2)]) == ["result", 2]
    assert seeder.seeds == [(("N", 1),)]  # off for the process: the second template is not seeded


@pytest.fixture
def fresh_decision(monkeypatch):
    """The process's seeding decision taken again in the test (and after it)."""
    monkeypatch.setattr(cache, "_off_reason", None)
    monkeypatch.delenv(cache.SWITCH, raising=False)
    cache._seeder.cache_clear()
    yield
    cache._seeder.cache_clear()


@pytest.mark.skipif(mx.cuda.is_available(), reason="MLX runs on CUDA here")
def test_seeding_is_off_without_mlxs_cuda_backend_and_wrap_changes_nothing(fresh_decision):
    assert not mlx_cuda.on_cuda()
    assert cache.enabled() is False
    kernel = StandIn()
    assert cache.wrap(kernel, "probe", BODY, "", ["x"], ["y"]) is kernel


def test_seeding_on_cuda_needs_a_checked_mlx_and_can_be_switched_off(fresh_decision, monkeypatch, tmp_path, caplog):
    """The decision past the CUDA check, MLX's CUDA backend faked: a GPU of compute capability 9.0 seeds for sm_90a
    into MLX's folder, unless MLX's version is not one checked on a GPU (said once) or the switch is 0."""
    monkeypatch.setattr(mlx_cuda, "on_cuda", lambda: True)
    monkeypatch.setattr(mx, "device_info", lambda: {"compute_capability_major": 9, "compute_capability_minor": 0})
    monkeypatch.setattr(cache, "driver_version", lambda: (99, 0))  # no GPU driver here
    monkeypatch.setattr(cache, "VERIFIED_MLX", frozenset({"9.9.9"}))
    monkeypatch.setattr(mx, "__version__", "9.9.9")
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    assert cache.enabled()
    seeder = cache._seeder()
    assert (seeder.arch, seeder.folder) == ("sm_90a", tmp_path)
    wrapped = cache.wrap(StandIn(), "probe", BODY, "", ["x"], ["y"])
    assert isinstance(wrapped, cache.SeedingKernel)
    monkeypatch.setenv(cache.SWITCH, "0")
    cache._seeder.cache_clear()
    assert not cache.enabled()
    monkeypatch.delenv(cache.SWITCH)
    monkeypatch.setattr(mx, "__version__", "0.0.1")
    cache._seeder.cache_clear()
    with caplog.at_level(logging.INFO, logger=cache.__name__):
        assert not cache.enabled() and not cache.enabled()
    assert len(caplog.records) == 1 and "0.0.1" in caplog.text
    monkeypatch.setenv(cache.SWITCH, "1")  # asked for under an unchecked version (the GPU check's own runs)
    cache._seeder.cache_clear()
    assert cache.enabled()
    monkeypatch.setattr(cache, "driver_version", lambda: (11, 0))  # NVRTC newer than the driver: its cubin may not load
    cache._seeder.cache_clear()
    with caplog.at_level(logging.INFO, logger=cache.__name__):
        assert not cache.enabled()
    assert "newer than the driver" in caplog.text


def test_seed_as_names_the_module_by_one_text_and_compiles_another(tmp_path):
    """What bench/gpu_kernel_cache.py uses to show on a GPU that MLX runs the file it finds (a body that differs)."""
    name, header, body, inputs, outputs = PROBE
    real = cache.Definition(name, header, body, inputs, outputs)
    other = cache.Definition(name, header, body.replace("s[0] * N", "42"), inputs, outputs)
    args = ([mx.zeros((2, 3), dtype=mx.float16), 3], TEMPLATE, [mx.bfloat16, mx.bool_])
    assert cache.KernelSeeder(tmp_path / "other", "sm_90a").seed_as(real, other, *args)
    assert cache.KernelSeeder(tmp_path / "real", "sm_90a").seed(real, *args)
    module = cache.module_name(*probe_sources()[:2])
    written, real_code = (cache.module_paths(tmp_path / folder, module)[0].read_bytes() for folder in ("other", "real"))
    assert written[:4] == real_code[:4] == b"\x7fELF" and written != real_code
