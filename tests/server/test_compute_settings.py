"""The `compute.*` and `model.draftModel` settings reach the engine through `start_backend`:
the path an engine runs, the draft model it speculates with, and the BLAS preloaded at start-up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine.request import Request
from server.core.backend import start_backend
from server.core.settings import ComputeSettings, parse_settings
from tests.server.harness import default_options

ROOT = Path(__file__).resolve().parents[2]


def test_compute_and_draft_settings_parse_and_bad_values_keep_their_defaults():
    settings, problems = parse_settings({"compute": {"attention": "mlx", "forward": "numpy", "compile": False,
                                                     "blas": "off", "blasThreads": 1, "linear": "dequantized",
                                                     "room": "off"},
                                         "model": {"speculation": "draft", "draftModel": "/models/small"}})
    assert problems == []
    assert settings.compute == ComputeSettings(attention="mlx", forward="numpy", compile=False, blas="off",
                                               blas_threads=1, linear="dequantized", room="off")
    assert (settings.model.speculation, settings.model.draft_model) == ("draft", "/models/small")
    settings, problems = parse_settings({"compute": {"attention": "gpu", "blasThreads": -2, "compile": "no",
                                                     "linear": "fp8", "room": 4096},
                                         "model": {"draftModel": ""}})
    assert settings.compute == ComputeSettings() and settings.model.draft_model == ""
    assert [p.split(":")[0] for p in problems] == ["compute.attention", "compute.blasThreads", "compute.compile",
                                                   "compute.linear", "compute.room"]


def test_the_compute_settings_default_to_the_engines_own_options():
    """`compute.*` mirrors `engine.compute_options.ComputeOptions` (the settings' docs are the server's): the same
    names, and the same defaults, so an engine built without settings computes as one built from the defaults."""
    import dataclasses

    from engine.compute_options import ComputeOptions

    assert dataclasses.asdict(ComputeSettings()) == dataclasses.asdict(ComputeOptions())


def test_start_backend_builds_the_engine_and_its_draft_model_from_the_settings(tiny_model):
    options = default_options(tiny_model, compute={"attention": "mlx", "compile": False})
    options["model"] |= {"speculation": "draft", "draftModel": str(tiny_model)}
    settings, problems = parse_settings(options)
    assert problems == []
    backend = start_backend(settings)
    try:
        engine = backend.engine
        assert engine.stats()["compute"] | {"blas": None} == {
            "kind": "mlx", "attention": "mlx", "forward": "mlx", "compile": False, "blas": None, "notes": [],
            "room_ahead": 4096,  # untraced: its attention reads the rows only
            "linear": {"mode": "unquantized", "min_rows": 0, "source": "no quantized layers", "measure_s": 0.0,
                       "timings_ms": {}},
            "kernels": {"qmv": False, "attention": False, "attention_mma": False, "attention_chunk": False, "kv_write": False,
                        "mlp_compiled": False, "step_traced": False, "step_traced_bf16": False, "qmv_fused": False, "rope_fused": False,
                        "attention_staged": False, "attention_transposed": False, "attention_chunk_q8": False,
                        "qmv_split": False, "residual_fused": False, "source": "not CUDA", "measure_s": 0.0,
                        "timings_ms": {},
                        "notes": []}}
        assert engine.prefix.policy.compute == engine.compute.identity()
        assert engine.draft is not None and engine.draft.compute.identity() == engine.compute.identity()
        done = engine.submit(Request(prompt_ids=list(range(3, 40)), max_tokens=6)).result()
        assert done.finish_reason in ("length", "stop") and done.metrics.drafted_tokens > 0
    finally:
        backend.close()


_START = """
import json, sys
from server.core.backend import start_backend
from server.core.settings import parse_settings
settings, _ = parse_settings(json.loads(sys.argv[1]))
backend = start_backend(settings)
import engine.blas
print(json.dumps([engine.blas.describe(), backend.engine.stats()["compute"]]))
backend.close()
"""


def test_start_backend_preloads_the_blas_before_mlx_is_imported(tiny_model, tmp_path):
    env = {**os.environ, "CODECTX_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    options = json.dumps(default_options(tiny_model, compute={"blasThreads": 1}))
    run = subprocess.run([sys.executable, "-c", _START, options], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    report, compute = json.loads(run.stdout.splitlines()[-1])
    assert report["interposed"] is True and report["mlx_imported_first"] is False
    assert report["threads"] == 1 and compute["blas"] == Path(report["library"]).name
