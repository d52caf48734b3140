"""engine.blas: MLX's cblas_sgemm really resolves to the preloaded OpenBLAS.

Each case runs in a fresh interpreter, because the preload must happen before
`mlx.core` is imported and the dynamic linker's choice lasts for the process.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from engine import elf

_BINDING_PROBE = """
import engine.blas
engine.blas.preload({choice!r})
import mlx.core as mx
mx.eval(mx.matmul(mx.ones((64, 64)), mx.ones((64, 64))))
"""

_DESCRIBE_PROBE = """
import json, time, engine.blas
engine.blas.preload({choice!r}, threads=1)
report = engine.blas.describe()
report["in_use"] = engine.blas.in_use()
import mlx.core as mx
a = mx.random.normal((512, 512)); mx.eval(a)
best = float("inf")
for _ in range(5):
    start = time.process_time()
    mx.eval(mx.matmul(a, a))
    best = min(best, time.process_time() - start)
report["sgemm_cpu_seconds"] = best
print(json.dumps(report))
"""


def _sgemm_binding(stderr: str) -> str:
    """The library that libmlx.so's cblas_sgemm was bound to, from LD_DEBUG=bindings."""
    lines = [line for line in stderr.splitlines() if "libmlx.so" in line and "`cblas_sgemm'" in line]
    assert len(lines) == 1, lines
    return lines[0].split(" to ", 1)[1].split(" [", 1)[0]


def _mlx_cpu_libs() -> Path:
    return Path(importlib.metadata.distribution("mlx-cpu").locate_file("mlx_cpu.libs"))


def test_mlx_sgemm_binds_to_preloaded_openblas(tmp_path, run_python):
    run = run_python(_BINDING_PROBE.format(choice="auto"), tmp_path, LD_DEBUG="bindings")
    assert Path(_sgemm_binding(run.stderr)).name == "libopenblas.so.0"
    assert list((tmp_path / "blas").glob("*/libgfortran.so.5")) or "system" in run.stderr


def test_off_keeps_the_bundled_reference_blas(tmp_path, run_python):
    run = run_python(_BINDING_PROBE.format(choice="off"), tmp_path, LD_DEBUG="bindings")
    assert Path(_sgemm_binding(run.stderr)).name.startswith("libblas-")


def test_optimized_blas_needs_much_less_cpu_than_reference(tmp_path, run_python):
    # One BLAS thread and CPU time (not wall time): the work a matmul costs, which other
    # processes on a shared CI machine do not change. Wall-clock speed belongs to bench/engine.py.
    fast = json.loads(run_python(_DESCRIBE_PROBE.format(choice="auto"), tmp_path).stdout)
    slow = json.loads(run_python(_DESCRIBE_PROBE.format(choice="off"), tmp_path).stdout)
    assert fast["interposed"] is True and fast["source"] == "cmeel-openblas (PyPI)"
    assert fast["threads"] == 1 and fast["in_use"] == "libopenblas.so.0"
    assert slow["library"] is None and "disabled" in slow["source"] and slow["in_use"] == "reference"
    # Reference BLAS: ~2 GFLOP/s of CPU time; OpenBLAS on one core: tens.
    assert slow["sgemm_cpu_seconds"] > 4 * fast["sgemm_cpu_seconds"], (fast, slow)


def test_a_missing_library_falls_back_without_raising(tmp_path, run_python):
    code = (f"import json, engine.blas; loaded = engine.blas.preload({str(tmp_path / 'nope.so')!r}); "
            "print(json.dumps([loaded, engine.blas.describe()]))")
    loaded, report = json.loads(run_python(code, tmp_path).stdout)
    assert loaded is None and report["interposed"] is False
    assert any("preload failed" in note for note in report["notes"])


def test_soname_rewrite_on_the_bundled_gfortran(tmp_path):
    bundled = sorted(_mlx_cpu_libs().glob("libgfortran-*.so*"))[0]
    copy = tmp_path / "libgfortran.so.5"
    copy.write_bytes(elf.with_soname(bundled.read_bytes(), "libgfortran.so.5"))
    assert elf.needed(copy) == elf.needed(bundled)
    assert elf.soname(copy) == "libgfortran.so.5"
    assert elf.soname(bundled) == bundled.name


def test_soname_rewrite_rejects_longer_names_and_non_elf(tmp_path):
    bundled = sorted(_mlx_cpu_libs().glob("libgfortran-*.so*"))[0]
    with pytest.raises(elf.ElfError, match="longer"):
        elf.with_soname(bundled.read_bytes(), "x" * 200)
    with pytest.raises(elf.ElfError, match="not a 64-bit"):
        elf.with_soname(b"#!/bin/sh\n" * 10, "libgfortran.so.5")


def test_thread_setting_is_applied_and_zero_means_the_usable_cores(tmp_path, run_python):
    code = "import json, engine.blas; engine.blas.preload(threads={}); print(json.dumps(engine.blas.describe()))"
    one = json.loads(run_python(code.format(1), tmp_path).stdout)
    default = json.loads(run_python(code.format(0), tmp_path).stdout)
    assert one["threads"] == 1 and one["interposed"] is True
    assert default["threads"] == min(len(os.sched_getaffinity(0)), 8) and default["interposed"] is True


def test_importing_engine_has_no_side_effect(tmp_path, run_python):
    code = ("import json, sys, engine, engine.request, engine.blas; "
            "print(json.dumps([engine.blas.describe()['source'], 'mlx.core' in sys.modules, engine.blas.in_use()]))")
    source, mlx_imported, in_use = json.loads(run_python(code, tmp_path).stdout)
    assert (source, mlx_imported, in_use) == ("not attempted", False, "reference")
    assert not (tmp_path / "blas").exists()  # nothing was loaded or copied


def test_an_emptied_copy_is_written_again(tmp_path, monkeypatch):
    """A rename without fsync leaves an empty file after a power loss: it was trusted because it
    existed, the preload failed at every start ("file too short"), and the archive made under
    OpenBLAS went unused."""
    from engine import blas

    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    bundled = sorted(_mlx_cpu_libs().glob("libgfortran-*.so*"))[0]
    copy = blas._soname_copy(bundled)
    good = copy.read_bytes()
    copy.write_bytes(b"")
    assert blas._soname_copy(bundled) == copy and copy.read_bytes() == good
    assert elf.soname(copy) == "libgfortran.so.5"
