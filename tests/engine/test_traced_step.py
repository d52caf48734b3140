"""A decode step replayed from one trace over the engine's window caches (`engine.compiled`,
`engine.trace_caches`): with MLX's kernels it is checked here against the plain call, number for number;
with our CUDA kernels (no CPU build) it is checked against the plain call under stand-ins for the kernels,
named `semantic_kernels`, whose outputs carry the positions and key counts they are given, so a trace that
froze a step's position, or a kernel fed another count, would change the logits."""
from __future__ import annotations

import mlx.core as mx
import pytest
from test_compiled import greedy
from test_decode_kernels import DENSE
from test_linear_mode import Timings, quantized_model

from engine import cuda_attention, cuda_backend, cuda_kv_write, cuda_qmv, decode_choice, trace_caches
from engine.compiled import CompiledDecodeStep
from engine.compute import ComputeOptions, ComputePath, choose
from engine.decode_choice import DecodeKernels, resolve
from engine.linear_mode_cache import LinearModeCache
from engine.step_measure import check_traced_step, filled_cache, time_traced_step
from engine.window import WindowPolicy, make_window_cache

POLICY = WindowPolicy(True, 16, 16, 8, 0, "block")


def prefilled(model, bits: int, n: int, dense_from: int = 200) -> list:
    cache = make_window_cache(model, POLICY, kv_bits=bits)
    for c in cache:
        c.dense_from = dense_from
    ids = (mx.arange(n) % 97 + 3).astype(mx.uint32)[None]
    for start in range(0, n, 64):
        model(ids[:, start:start + 64], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


@pytest.mark.parametrize("bits", [16, 8])
def test_window_caches_decode_from_one_trace_per_capacity_as_the_plain_call_does(tiny_loaded, bits):
    model = tiny_loaded.model
    plain, traced = prefilled(model, bits, 240), prefilled(model, bits, 240)
    step = CompiledDecodeStep(model)
    expected, expected_logits = greedy(lambda t, c: model(t, cache=c), plain, 30)  # 240 + 30 crosses 256 rows
    tokens, logits = greedy(step, traced, 30)
    assert tokens == expected and (step.traces, step.fallbacks) == (2, 0)
    assert max(mx.abs(a - b).max().item() for a, b in zip(expected_logits, logits)) < 1e-4
    for a, b in zip(plain, traced):
        assert a.offset == b.offset == 270
        assert all(mx.allclose(x, y, atol=1e-5).item() for x, y in zip(a.state, b.state))
    more = mx.array([[7, 8, 9]], dtype=mx.uint32)  # a prefill after it continues the same cache
    assert mx.allclose(model(more, cache=plain), model(more, cache=traced), atol=1e-4).item()


def test_windowed_positions_take_the_plain_call(tiny_loaded):
    model = tiny_loaded.model
    step = CompiledDecodeStep(model)
    plain, cache = prefilled(model, 8, 100, dense_from=400), prefilled(model, 8, 100, dense_from=400)
    assert greedy(step, cache, 3)[0] == greedy(lambda t, c: model(t, cache=c), plain, 3)[0]
    assert (step.traces, step.fallbacks) == (0, 3)


def test_the_path_verifies_drafts_over_window_caches_from_a_trace(tiny_loaded):
    model = tiny_loaded.model
    path = choose(model, ComputeOptions(attention="mlx"))
    plain, cache = prefilled(model, 8, 120, dense_from=0), prefilled(model, 8, 120, dense_from=0)
    drafts = mx.array([[5, 9, 11, 13]], dtype=mx.uint32)
    assert mx.allclose(path.verify(drafts, cache), model(drafts, cache=plain), atol=1e-4).item()
    assert cache[0].offset == plain[0].offset == 124
    assert (path.verify_step.traces, path.verify_step.fallbacks) == (1, 0)


@pytest.fixture
def semantic_kernels(monkeypatch):
    """Stand-ins for our CUDA kernels (no CPU build): the linears compute MLX's quantized product; the write
    writes nothing and returns its row's position; the attention returns a pattern of its key count n and
    of what it is ordered after (the write's position p; without a write, n again): sin(0.05 n + d) +
    cos(0.3 p) for dim d of every head. Records the calls made (a replayed trace makes none)."""
    calls = []

    def qmv(inputs, template, output_shapes, output_dtypes, **_):
        calls.append("qmv")
        x, w, scales, biases = inputs
        t = dict(template)
        out = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=t["GS"], bits=t["BITS"])
        return [out.reshape(output_shapes[0]).astype(output_dtypes[0])]

    def write(inputs, **_):
        calls.append("write")
        return [inputs[-1].astype(mx.int32)]

    def partial(inputs, output_shapes, **_):
        calls.append("attention")
        n, p = inputs[-2][0].astype(mx.float32), inputs[-1][0].astype(mx.float32)
        value = mx.sin(0.05 * n + mx.arange(output_shapes[0][-1], dtype=mx.float32)) + mx.cos(0.3 * p)
        return [mx.broadcast_to(value, output_shapes[0]), mx.zeros(output_shapes[1], dtype=mx.float32)]

    def merge(inputs, output_shapes, template, **_):
        return [inputs[0][:, 0, :].reshape(output_shapes[0]).astype(dict(template)["T"])]

    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_kv_write, "shape_problem", lambda keys, bits, group_size=64: None)
    monkeypatch.setattr(cuda_attention, "unsupported", lambda *args: None)
    monkeypatch.setattr(cuda_qmv, "unsupported", lambda linear, dtype: None)
    monkeypatch.setattr(cuda_qmv, "_kernel", lambda: qmv)
    monkeypatch.setattr(cuda_kv_write, "_q8_kernel", lambda: write)
    monkeypatch.setattr(cuda_attention, "_kernels", lambda: (partial, merge))
    return calls


OURS = DecodeKernels(qmv=True, attention=True, kv_write=True, source="setting")
TRACED = DecodeKernels(qmv=True, attention=True, kv_write=True, step_traced=True, source="setting")


def test_our_kernels_in_a_trace_take_each_steps_position_and_key_count(tiny_model_dir, semantic_kernels):
    model = quantized_model(tiny_model_dir)
    plain = ComputePath(model, kernels=OURS)
    traced = ComputePath(model, kernels=TRACED, compiled=True)
    assert traced.identity().endswith("kernels=qmv+attention+kv_write+step_traced")
    caches = [filled_cache(model, DENSE, 8, 200, mx.float32) for _ in range(2)]
    check_traced_step(lambda t, c: plain.forward(t, c), traced.decode_step, *caches)  # the load-time check passes
    expected = greedy(lambda t, c: plain.forward(t, c, "last"), caches[0], 12)
    before = len(semantic_kernels)
    got = greedy(lambda t, c: traced.forward(t, c, "last"), caches[1], 12)
    assert semantic_kernels[before:] == []  # replayed: no kernel call made in Python
    assert got[0] == expected[0]
    assert max(mx.abs(a - b).max().item() for a, b in zip(expected[1], got[1])) < 1e-5
    # each step saw another key count and position: the logits move far more between steps than the paths differ
    assert min(mx.abs(a - b).max().item() for a, b in zip(got[1], got[1][1:])) > 1e-3
    step = traced.decode_step
    assert (step.traces, step.fallbacks) == (1, 0)
    greedy(lambda t, c: traced.forward(t, c, "last"), caches[1], 50)  # 215 + 50 crosses the buffers' 256 rows
    assert (step.traces, step.fallbacks) == (2, 1)  # the plain call grows them; then a trace at the new size
    caches[1][0].state  # a checkpoint's views: the next write may not go in place, so no trace for it
    greedy(lambda t, c: traced.forward(t, c, "last"), caches[1], 2)
    assert (step.traces, step.fallbacks) == (2, 2)
    assert ComputePath(model, kernels=TRACED).decode_step is None  # compute.compile off: nothing traced


def test_the_traced_step_runs_where_measured_faster_and_only_with_the_in_place_write(tiny_model_dir, tmp_path):
    model = quantized_model(tiny_model_dir)
    store = LinearModeCache(tmp_path / "linear-modes.json")
    wins = {"qmv": (2e-3, 1e-3), "attention": (1e-3, 0.5e-3), "kv_write": (1e-3, 0.5e-3),
            "step_traced": (30e-3, 20e-3)}
    chosen = resolve(model, "auto", measure=Timings(wins), cache=store, cuda=True)
    assert chosen.step_traced and chosen.identity().endswith("+step_traced")
    without_write = resolve(model, "auto", measure=Timings({**wins, "kv_write": (1e-3, 2e-3)}),
                            cache=LinearModeCache(tmp_path / "other.json"), cuda=True)
    assert not without_write.step_traced and "kernels: step_traced needs kv_write" in without_write.notes
    assert ComputePath(model, kernels=without_write, compiled=True).decode_step is None  # our kernels, no trace
    assert ComputePath(model, kernels=chosen, compiled=True).decode_step.ours
    assert decode_choice.resolve(model, "codectx", cuda=True).step_traced == decode_choice._our_attention_takes(model)


def test_the_load_time_measurement_times_both_steps_after_checking_the_traced_one(tiny_model_dir, semantic_kernels,
                                                                                   monkeypatch, caplog):
    model = quantized_model(tiny_model_dir)
    plain_s, traced_s = time_traced_step(model, OURS)["step_traced"]
    assert plain_s > 0 and traced_s > 0
    assert time_traced_step(model, DecodeKernels(qmv=True, attention=True, source="setting")) == {}  # no write
    monkeypatch.setattr(trace_caches, "layer_buffers", lambda cache, n, ours: None)  # every step falls back
    assert time_traced_step(model, OURS) == {}
    assert "traced step: the step was not replayed from its trace; not using it" in caplog.text
