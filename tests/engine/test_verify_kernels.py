"""The few-row linears a speculative round runs, built before the first request: our linear kernel is compiled
per row bucket at first use (`engine.cuda_qmv.ROW_BUCKETS`), and with 8-bit KV every GPU restart's first verify
round waited 8-12 s (docs/benchmarks.md, *GPU engine*, twenty-fourth session). The kernel is CUDA's: a stand-in
computing MLX's quantized product takes its place here (tests/engine/conftest.py)."""
from __future__ import annotations

from test_decode_head import untied_llama
from test_linear_mode import q4_loaded  # noqa: F401 (a fixture)

from engine import cuda_qmv
from engine.compute import ComputePath
from engine.decode_choice import DecodeKernels
from engine.engine import Engine
from engine.request import Request


def test_each_verify_bucket_is_built_where_our_linears_run(semantic_kernels, monkeypatch):
    launched: list[int] = []
    stand_in = cuda_qmv._kernel()

    def recording(**launch):
        launched.append(dict(launch["template"])["M"])
        return stand_in(**launch)

    monkeypatch.setattr(cuda_qmv, "_kernel", lambda: recording)
    model = untied_llama(2)
    assert ComputePath(model, kernels=DecodeKernels(qmv=True, source="setting")).build_verify_kernels() > 0
    assert set(launched) >= {2, 4, 8}  # every bucket past decode's (the head's last row is decode's, 1)
    launched.clear()
    assert ComputePath(model).build_verify_kernels() == 0 and launched == []  # MLX's linears: nothing to build


def test_an_engine_builds_them_before_serving_only_when_it_speculates(q4_loaded):  # noqa: F811
    for speculation, expected in (("lookup", 0.0), ("off", None)):  # (MLX's linears on the CPU: nothing to build)
        with Engine(q4_loaded, speculation=speculation) as eng:
            assert eng.submit(Request(prompt_ids=[5, 6, 7], max_tokens=2)).result().finish_reason in ("length", "stop")
            assert eng.verify_kernels_s == expected
