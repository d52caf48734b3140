"""engine.linear_mode: the choice from timings, its cache per device and shape, the fallback, the
fingerprint, and the dequantizing linear against the quantized kernel (a 4-bit tiny model on the CPU)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.utils import load_model as mlx_load_model

from engine import cuda_dequant
from engine.compute import ComputeOptions, choose
from engine.engine import Engine
from engine.kv import make_cache
from engine.linear_mode import (LADDER, DequantizingLinear, LinearMode, decide, dequantized_product,
                                first_block_linears, resolve)
from engine.linear_mode_cache import LinearModeCache, cache_path
from engine.loaded_model import LoadedModel
from engine.request import PromptSegment, Request

WINS_FROM_256 = {32: (1.0, 1.7), 64: (1.0, 1.5), 128: (1.0, 1.01), 256: (1.0, 0.8), 512: (2.0, 1.0),
                 1024: (4.0, 1.5), 2048: (8.0, 2.5)}
NEVER_WINS = {rows: (1.0, 1.2) for rows in LADDER}


def quantized_model(directory: Path, bits: int = 4) -> nn.Module:
    """The tiny llama's weights, its linears (and embeddings) quantized: a model as a GPU keeps it."""
    model, _ = mlx_load_model(directory)
    nn.quantize(model, group_size=64, bits=bits)
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="module")
def q4_loaded(tiny_model_dir, tiny_loaded):
    return LoadedModel(model=quantized_model(tiny_model_dir), tokenizer=tiny_loaded.tokenizer, model_id="tiny-q4",
                       weight_hash="tiny-q4", context_length=4096, path=tiny_model_dir, config={})


class Timings:
    """The measurement, replaced by given timings (the clock is not ours to control); counts its calls."""

    def __init__(self, timings: dict) -> None:
        self.timings, self.calls = timings, 0

    def __call__(self, model) -> dict:
        self.calls += 1
        return dict(self.timings)


def test_decide_takes_the_smallest_rung_from_which_dequantizing_wins_at_every_larger_one():
    assert decide(WINS_FROM_256) == ("dequantized", 256)
    assert decide(NEVER_WINS) == ("quantized", 0)
    # a win below a loss does not count; a win inside the margin is no win
    assert decide({**WINS_FROM_256, 128: (1.0, 0.5), 256: (1.0, 0.97)}) == ("dequantized", 512)
    mode = LinearMode("dequantized", 256)
    assert [mode.applies(rows) for rows in (1, 32, 255, 256, 2048)] == [False, False, False, True, True]
    assert not LinearMode("quantized").applies(4096) and mode.identity() == "linear=dequantized>=256"


def test_auto_measures_once_per_device_and_shape_and_caches_under_codectx_home(tiny_model_dir, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    timings = Timings(WINS_FROM_256)
    first = resolve(quantized_model(tiny_model_dir), "auto", measure=timings)
    assert (first.mode, first.min_rows, first.source, timings.calls) == ("dequantized", 256, "measured", 1)
    again = resolve(quantized_model(tiny_model_dir), "auto", measure=timings)  # same shape: no new measurement
    assert (again.mode, again.min_rows, again.source, timings.calls) == ("dequantized", 256, "cached", 1)
    assert again.timings == first.timings
    other = resolve(quantized_model(tiny_model_dir, bits=8), "auto", measure=Timings(NEVER_WINS))
    assert (other.mode, other.source) == ("quantized", "measured")  # another shape: measured on its own
    entries = json.loads(cache_path().read_text())
    assert cache_path() == tmp_path / "compute" / "linear-modes.json" and len(entries) == 2
    assert {e["device"]["type"] for e in entries.values()} == {"cpu"}


def test_a_failed_measurement_or_a_bad_cache_never_stops_a_load(tiny_model_dir, tmp_path, caplog):
    def broken(model):
        raise RuntimeError("out of memory")

    store = LinearModeCache(tmp_path / "linear-modes.json")
    with caplog.at_level(logging.WARNING, logger="engine.linear_mode"):
        fallback = resolve(quantized_model(tiny_model_dir), "auto", measure=broken, cache=store)
    assert (fallback.mode, fallback.source) == ("quantized", "fallback") and "out of memory" in caplog.text
    assert fallback.notes == ("linear: measuring failed: out of memory",) and not store.path.exists()
    store.path.write_text("{not json")
    timings = Timings(WINS_FROM_256)
    assert resolve(quantized_model(tiny_model_dir), "auto", measure=timings, cache=store).source == "measured"
    assert timings.calls == 1 and len(json.loads(store.path.read_text())) == 1  # rewritten, readable
    key = next(iter(json.loads(store.path.read_text())))
    store.path.write_text(json.dumps({key: {"timings": {"64": "fast"}}}))  # a malformed entry is measured around
    assert resolve(quantized_model(tiny_model_dir), "auto", measure=timings, cache=store).source == "measured"
    unwritable = LinearModeCache(tmp_path / "file" / "linear-modes.json")
    (tmp_path / "file").write_text("a file where the folder should be")
    assert resolve(quantized_model(tiny_model_dir), "auto", measure=timings, cache=unwritable).mode == "dequantized"


def test_the_cpu_build_has_nothing_to_choose(tiny_loaded, tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    path = choose(tiny_loaded.model, ComputeOptions())  # float32 weights: no quantized layers
    assert path.linear.mode == "unquantized" and path.identity().endswith("linear=unquantized")
    forced = choose(tiny_loaded.model, ComputeOptions(linear="dequantized"))
    assert forced.linear.mode == "unquantized" and "no quantized layers" in forced.notes[-1]
    assert forced.identity() == path.identity() and not cache_path().exists()


def test_dequantized_weights_compute_the_quantized_product_and_decode_keeps_the_kernel(q4_loaded):
    model = q4_loaded.model
    quantized = choose(model, ComputeOptions(attention="mlx", compile=False, linear="quantized"))
    dequantized = choose(model, ComputeOptions(attention="mlx", compile=False, linear="dequantized"))
    linear = model.layers[0].mlp.up_proj
    assert isinstance(linear, DequantizingLinear)  # wired: same parameters, same names
    x = mx.random.normal((100, 128), key=mx.random.key(3))
    assert mx.array_equal(linear(x), nn.QuantizedLinear.__call__(linear, x)).item()  # outside the context
    assert mx.allclose(dequantized_product(linear, x), linear(x), atol=1e-4).item()
    ids = mx.array([list(range(3, 103))], dtype=mx.uint32)
    a = quantized.forward(ids, make_cache(model))
    b = dequantized.forward(ids, make_cache(model))
    assert not mx.array_equal(a, b).item() and mx.allclose(a, b, atol=1e-3).item()  # another path, same values
    one = mx.array([[7]], dtype=mx.uint32)  # decode-sized: the quantized kernel under either mode
    assert mx.array_equal(quantized.forward(one, make_cache(model)), dequantized.forward(one, make_cache(model))).item()


def test_the_mode_is_part_of_the_policy_and_checkpoints_of_one_mode_are_not_restored_under_another(
        q4_loaded, tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    segments = [PromptSegment("file", "a.py", tuple(range(10, 90))), PromptSegment("question", "", (5, 6, 7))]
    answers = {}
    for mode in ("quantized", "dequantized"):
        with Engine(q4_loaded, prefill_chunk=64, archive_bytes=1 << 24,
                    compute=ComputeOptions(attention="mlx", linear=mode)) as eng:
            done = eng.submit(Request(segments=segments, max_tokens=12)).result()
            answers[mode] = (done.text, done.metrics.cached_tokens, done.metrics.miss_reason,
                             eng.prefix.policy.compute, eng.stats()["compute"]["linear"]["mode"])
    assert answers["quantized"][3].endswith("linear=quantized") and answers["quantized"][4] == "quantized"
    assert answers["dequantized"][3].endswith(f"linear=dequantized>={LADDER[0]}")
    assert answers["dequantized"][4] == "dequantized"
    assert answers["dequantized"][1:3] == (0, "policy mismatch")  # the first engine's archive is not restored
    assert answers["quantized"][0] == answers["dequantized"][0]  # greedy output is the same either way
    with Engine(q4_loaded, prefill_chunk=64, archive_bytes=1 << 24,
                compute=ComputeOptions(attention="mlx", linear="dequantized")) as same:
        again = same.submit(Request(segments=segments, max_tokens=2)).result()
    assert again.metrics.cached_tokens == 80 and again.finish_reason in ("length", "stop")


def test_dequantized_weights_come_from_mlx_where_our_kernel_cannot_run(q4_loaded):
    """Off MLX's CUDA backend the dequantize kernel is never used: the weight is MLX's `dequantize`, exactly."""
    linear = first_block_linears(q4_loaded.model)[0]
    k = linear["weight"].shape[-1] * 32 // linear.bits
    assert cuda_dequant.unsupported(linear.bits, linear.group_size, k, mx.bfloat16) == "not MLX's CUDA backend"
    expected = mx.dequantize(linear["weight"], linear["scales"], linear["biases"], linear.group_size, linear.bits,
                             dtype=mx.float32)
    assert mx.array_equal(cuda_dequant.weight_of(linear, mx.float32), expected).item()


def test_a_measurement_wires_linears_for_its_own_block_only(tiny_model_dir):
    from engine import linear_mode

    model = quantized_model(tiny_model_dir)
    up, gate = model.layers[0].mlp.up_proj, model.layers[0].mlp.gate_proj
    wired_before = model.layers[1].mlp.up_proj
    wired_before.__class__ = DequantizingLinear  # as a compute path wires it: left as it is
    with linear_mode.wired([up, gate, wired_before]):
        assert isinstance(up, DequantizingLinear) and isinstance(gate, DequantizingLinear)
    assert type(up) is nn.QuantizedLinear and type(gate) is nn.QuantizedLinear  # given their class back
    assert isinstance(wired_before, DequantizingLinear)
