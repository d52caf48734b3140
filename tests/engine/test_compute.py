"""engine.compute: one chooser, typed options, and the resolved path in the checkpoint policy."""
from __future__ import annotations

import logging

import mlx.core as mx
import pytest

from engine import blas
from engine.compute import ComputeOptions, choose, exact
from engine.engine import Engine
from engine.kv import make_cache
from engine.request import PromptSegment, Request

from spec_helpers import tiny_hybrid

UNQUANTIZED = {"mode": "unquantized", "min_rows": 0, "source": "no quantized layers", "measure_s": 0.0,
               "timings_ms": {}}
"""The linear mode of a float32 model (engine.linear_mode): nothing to choose."""
NO_KERNELS = {"qmv": False, "attention": False, "attention_mma": False, "attention_chunk": False, "kv_write": False,
              "mlp_compiled": False, "step_traced": False, "step_traced_bf16": False, "qmv_fused": False, "rope_fused": False,
              "attention_staged": False, "attention_transposed": False, "attention_chunk_q8": False, "qmv_split": False,
              "residual_fused": False,
              "source": "not CUDA", "measure_s": 0.0,
              "timings_ms": {},
              "notes": []}
"""Our CUDA decode kernels (engine.decode_choice) on the CPU: nothing to choose."""


def test_options_reject_values_outside_their_choices():
    for bad in (dict(attention="fast"), dict(forward="gpu"), dict(blas_threads=-1), dict(blas="")):
        with pytest.raises(ValueError):
            ComputeOptions(**bad)


def test_auto_resolves_to_what_runs_and_explicit_numpy_falls_back_with_a_warning(tiny_loaded, caplog):
    model = tiny_loaded.model
    auto = choose(model, ComputeOptions())
    assert auto.kind == "numpy-forward" and not auto.compiled  # the NumPy forward never uses the compiled steps
    assert auto.identity() == choose(model, ComputeOptions(attention="numpy", forward="numpy")).identity()
    assert choose(model, ComputeOptions(forward="mlx")).identity() == (
        f"attention=numpy forward=mlx compile=on blas={blas.in_use()} linear=unquantized")
    with caplog.at_level(logging.WARNING, logger="engine.compute"):
        resolved = choose(model, ComputeOptions(attention="mlx", forward="numpy"))
    assert resolved.kind == "mlx" and "needs NumPy attention" in resolved.notes[0]
    assert "compute.forward 'numpy' does not apply" in caplog.text
    hybrid = choose(tiny_hybrid(seed=2), ComputeOptions())
    assert hybrid.kind == "mlx" and hybrid.compiled  # not llama/qwen-style attention: exact MLX
    assert exact(model).identity() == f"attention=mlx forward=mlx compile=off blas={blas.in_use()} linear=unquantized"


def test_the_engine_chooses_once_and_its_policy_names_the_resolved_path(tiny_loaded):
    engines = {name: Engine(tiny_loaded, prefill_chunk=16, compute=options) for name, options in {
        "auto": ComputeOptions(), "numpy": ComputeOptions(attention="numpy", forward="numpy"),
        "mlx": ComputeOptions(attention="mlx"), "no-compile": ComputeOptions(attention="mlx", compile=False)}.items()}
    try:
        policies = {name: engine.prefix.policy for name, engine in engines.items()}
        assert policies["auto"].compute == engines["auto"].compute.identity()
        assert policies["auto"].fingerprint() == policies["numpy"].fingerprint()  # "auto" is what ran
        assert len({policies[n].fingerprint() for n in ("auto", "mlx", "no-compile")}) == 3
        assert engines["mlx"].stats()["compute"] == {"kind": "mlx", "attention": "mlx", "forward": "mlx",
                                                     "compile": True, "blas": blas.in_use(), "notes": [],
                                                     "linear": UNQUANTIZED, "kernels": NO_KERNELS,
                                                     "room_ahead": 0}  # MLX's trace attends over whole buffers
    finally:
        for engine in engines.values():
            engine.close()


def test_checkpoints_of_one_path_are_not_restored_under_another(tiny_loaded, tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))  # an archive of this test's own
    segments = [PromptSegment("file", "a.py", tuple(range(10, 90))), PromptSegment("question", "", (5, 6, 7))]
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=1 << 24, compute=ComputeOptions()) as first:
        first.submit(Request(segments=segments, max_tokens=2)).result()
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=1 << 24,
                compute=ComputeOptions(attention="mlx")) as other:
        done = other.submit(Request(segments=segments, max_tokens=2)).result()
    assert done.metrics.cached_tokens == 0 and done.metrics.miss_reason == "policy mismatch"
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=1 << 24, compute=ComputeOptions()) as same:
        again = same.submit(Request(segments=segments, max_tokens=2)).result()
    assert again.metrics.cached_tokens == 80  # the archive of the same path restores the file


def test_an_exact_path_is_the_models_own_call(tiny_loaded):
    model = tiny_loaded.model
    ids = mx.array([[3, 4, 5, 6]], dtype=mx.uint32)
    assert mx.array_equal(exact(model).forward(ids, make_cache(model)), model(ids, cache=make_cache(model))).item()


def test_on_cuda_only_our_kernels_traces_run(tiny_loaded, monkeypatch):
    """MLX's CUDA dynamic slice update (a trace's row write with MLX's kernels) costs the whole cache buffer: there
    the path traces neither decode nor verify with MLX's kernels, and says so; our kernels' measured trace stays."""
    from engine import cuda_backend
    from engine.compute import ComputePath
    from engine.decode_choice import DecodeKernels

    model = tiny_loaded.model
    elsewhere = ComputePath(model, compiled=True)  # (here: the CPU) both are traced
    assert elsewhere.decode_step is not None and elsewhere.verify_step is not None
    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: True)
    mlx_only = ComputePath(model, compiled=True)
    assert mlx_only.decode_step is None and mlx_only.verify_step is None
    assert any("no trace with MLX's kernels on CUDA" in note for note in mlx_only.notes)
    traced = ComputePath(model, compiled=True, kernels=DecodeKernels(qmv=True, attention=True, kv_write=True,
                                                                      step_traced=True, source="setting"))
    assert traced.decode_step is not None and traced.verify_step is None
    assert not any("no trace" in note for note in traced.notes)
