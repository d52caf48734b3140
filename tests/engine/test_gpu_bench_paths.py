"""bench/gpu_attention.py's decode and chunk sections run their Python on the CPU before a lent GPU does: MLX's
`cuda_kernel` recorded (tests/engine/cuda_compile.py, a stand-in whose launches return zeros, so the timings and
errors printed mean nothing here), at small sizes. A name or shape mistake in the benchmark then fails here, not
a few minutes into a device call."""
from __future__ import annotations

import importlib
from pathlib import Path

from test_cuda_compile import recorder  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parents[2]


def test_the_attention_benchmarks_decode_and_chunk_rows_have_every_column(recorder, monkeypatch):  # noqa: F811
    monkeypatch.syspath_prepend(str(ROOT))
    bench = importlib.import_module("bench.gpu_attention")
    monkeypatch.setattr(bench, "CALLS", 2)
    monkeypatch.setattr(bench, "DISTINCT", 2)
    result: dict = {}
    bench.section_decode(result, [1000], 1000.0)
    bench.section_chunk(result, 1000, 1000.0, [12])
    decode = result["decode"][0]
    for kernel in bench.DECODE_KERNELS:
        assert {f"{kernel}_ms", f"{kernel}_gbs", f"err_{kernel}"} <= decode.keys()
    assert [(v["kernel"], v["stages"], v["combine"]) for v in decode["staged_variants"] if "ms" in v] == \
        [(kernel, stages, combine) for kernel, stages, _, _, combine in bench.STAGED_VARIANTS]
    assert len(result["chunk"]) == 8  # four chunk sizes at two key counts
    for row in result["chunk"]:
        assert {"q8_warm_ms", "err_q8", "dequantized_bf16_warm_ms", "mlx_warm_ms"} <= row.keys()
        assert set(row["ours"]) == {12}
    assert any(label.startswith("codectx_chunk_attention_q8") for label in recorder.sources())


def test_the_tensor_core_linear_experiment_compiles_and_its_rows_have_every_column(recorder, monkeypatch):  # noqa: F811
    """bench/gpu_qmv_mma.py: its kernel compiles for the H200 without spilling, and a shape's row (tiny here) has
    each kernel's time, bandwidth and error."""
    from tests.engine.cuda_compile import compile_errors, resources

    monkeypatch.syspath_prepend(str(ROOT))
    bench = importlib.import_module("bench.gpu_qmv_mma")
    bench._kernel.cache_clear()
    row = bench.shape_row("tiny", 64, 1024, calls=2, distinct_bytes=1)
    assert row["split"] == 1 and {"qmv_ms", "mma_ms", "err_qmv", "err_mma", "mma_gbs"} <= row.keys()
    sources = {label: source for label, source in recorder.sources().items() if label.startswith("codectx_qmv_mma")}
    assert sources
    for source in sources.values():
        assert compile_errors(source) is None
        used = resources(source)
        assert used["spill_stores"] == used["spill_loads"] == 0, used
    bench._kernel.cache_clear()
