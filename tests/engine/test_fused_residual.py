"""A block's residual adds in its o and down projections' launches (`engine.fused_residual`): which forwards
offer them, that the model computes the same, and when the engine runs it. Our kernels are CUDA's: the
`semantic_kernels` stand-ins (conftest.py) compute MLX's product, plus the residual for the kernel that adds one,
and record their calls; the device code is compiled in test_cuda_compile.py and checked against MLX's add at load
(`engine.residual_measure`)."""
from __future__ import annotations

import logging

import mlx.core as mx
from test_compiled import greedy
from test_decode_kernels import DENSE
from test_linear_mode import quantized_model
from test_traced_step import TRACED

from engine import cuda_qmv, fused_residual, residual_measure
from engine.compute import ComputePath
from engine.decode_choice import DecodeKernels, choose_kernels, resolve
from engine.step_measure import check_traced_step, filled_cache

OURS = DecodeKernels(qmv=True, source="setting")
FUSED = DecodeKernels(qmv=True, residual_fused=True, source="setting")


def forward(path, tokens: list[int]) -> mx.array:
    cache = filled_cache(path.model, DENSE, 16, 200, mx.float32)
    return path.forward(mx.array([tokens], dtype=mx.uint32), cache)


def test_each_blocks_residuals_are_added_in_its_projections_launches_for_decode_sized_forwards(
        tiny_model_dir, semantic_kernels):
    model = quantized_model(tiny_model_dir)
    layers = len(model.layers)
    plain, fused = ComputePath(model, kernels=OURS), ComputePath(model, kernels=FUSED)
    assert fused.identity().endswith("kernels=qmv+residual_fused")
    for tokens, launches in (([7], 2 * layers), ([7, 9, 11], 0)):  # three rows pad to four: MLX adds them
        expected = forward(plain, tokens)
        before = len(semantic_kernels)
        got = forward(fused, tokens)
        assert semantic_kernels[before:].count("qmv+residual") == launches
        assert mx.allclose(got, expected, atol=1e-4).item()
    assert semantic_kernels.count("qmv+residual") == 2 * layers  # and none in the plain path's forwards


def test_a_projection_our_kernel_does_not_take_leaves_the_residual_to_its_block(tiny_model_dir, semantic_kernels,
                                                                                  monkeypatch):
    expected = forward(ComputePath(quantized_model(tiny_model_dir), kernels=OURS), [7])
    model = quantized_model(tiny_model_dir)  # the same weights; no verdict kept on its linears yet
    downs = [block.mlp.down_proj for block in model.layers]
    monkeypatch.setattr(cuda_qmv, "unsupported", lambda linear, dtype: "a stand-in's refusal" if any(
        linear is down for down in downs) else None)
    before = len(semantic_kernels)
    got = forward(ComputePath(model, kernels=FUSED), [7])
    assert semantic_kernels[before:].count("qmv+residual") == len(model.layers)  # the o projections'
    assert mx.allclose(got, expected, atol=1e-4).item()


def test_an_mlp_replayed_from_its_trace_is_not_offered_a_residual(tiny_model_dir, semantic_kernels):
    """The MLP's trace (`engine.compiled_mlp`) is made in one step and replayed in later ones: a residual taken
    inside it would be that first step's."""
    model = quantized_model(tiny_model_dir)
    traced_mlp = ComputePath(model, kernels=DecodeKernels(qmv=True, mlp_compiled=True, residual_fused=True,
                                                          source="setting"))
    expected = [forward(ComputePath(model, kernels=OURS), [t]) for t in (7, 8)]
    before = len(semantic_kernels)
    got = [forward(traced_mlp, [t]) for t in (7, 8)]  # traced at the first, replayed at the second
    assert semantic_kernels[before:].count("qmv+residual") == 2 * len(model.layers)  # the o projections only
    assert all(mx.allclose(a, b, atol=1e-4).item() for a, b in zip(got, expected))


def test_a_traced_step_adds_the_residuals_of_each_step(tiny_model_dir, semantic_kernels):
    model = quantized_model(tiny_model_dir)
    plain = ComputePath(model, kernels=DecodeKernels(**{**TRACED.__dict__, "step_traced": False}))
    traced = ComputePath(model, kernels=DecodeKernels(**{**TRACED.__dict__, "residual_fused": True}), compiled=True)
    caches = [filled_cache(model, DENSE, 8, 200, mx.float32) for _ in range(2)]
    before = len(semantic_kernels)
    check_traced_step(lambda t, c: plain.forward(t, c), traced.decode_step, *caches)  # the load-time check passes
    assert semantic_kernels[before:].count("qmv+residual") == 2 * len(model.layers)  # in the trace, made once
    expected = greedy(lambda t, c: plain.forward(t, c, "last"), caches[0], 8)
    got = greedy(lambda t, c: traced.forward(t, c, "last"), caches[1], 8)
    assert got[0] == expected[0] and (traced.decode_step.traces, traced.decode_step.fallbacks) == (1, 0)
    assert max(mx.abs(a - b).max().item() for a, b in zip(expected[1], got[1])) < 1e-4


def test_the_load_time_check_leaves_out_a_kernel_that_drops_the_residual(tiny_model_dir, semantic_kernels,
                                                                          monkeypatch, caplog):
    model = quantized_model(tiny_model_dir)
    fused_residual.wire(model)
    timings = residual_measure.measure(model)
    assert set(timings) == {"residual_fused"} and all(t > 0 for t in timings["residual_fused"])
    product = cuda_qmv._kernel()
    monkeypatch.setattr(cuda_qmv, "_residual_kernel", lambda: lambda inputs, **options: product(inputs[:4], **options))
    with caplog.at_level(logging.WARNING, logger="engine.residual_measure"):
        assert residual_measure.measure(model) == {}
    assert "residual_fused kernel disagrees" in caplog.text
    monkeypatch.undo()


def test_the_load_time_check_holds_the_wired_block_to_its_own_call(tiny_model_dir, semantic_kernels, monkeypatch,
                                                                   caplog):
    """A block whose wiring added a residual its projection had taken (twice, then) fails the check at load."""
    model = quantized_model(tiny_model_dir)
    added = fused_residual.added
    monkeypatch.setattr(fused_residual, "added", lambda linear, residual, call: residual + added(linear, residual, call))
    with caplog.at_level(logging.WARNING, logger="engine.residual_measure"):
        assert residual_measure.measure(model) == {}
    assert "residual_fused block disagrees" in caplog.text


def test_it_runs_only_beside_our_linears_and_where_the_blocks_take_the_call(tiny_model_dir):
    from spec_helpers import tiny_hybrid

    chosen, notes = choose_kernels({"residual_fused": (1e-3, 0.5e-3)})
    assert not chosen["residual_fused"] and "kernels: residual_fused needs qmv" in notes
    chosen, _ = choose_kernels({"qmv": (1e-3, 0.5e-3), "residual_fused": (1e-3, 0.5e-3)})
    assert chosen["residual_fused"]
    assert resolve(quantized_model(tiny_model_dir), "codectx", cuda=True).residual_fused
    assert not fused_residual.wirable(tiny_hybrid(seed=1))  # other blocks: MLX's adds, even when forced
    assert not resolve(tiny_hybrid(seed=1), "codectx", cuda=True).residual_fused


def test_the_split_kernel_and_a_linear_with_a_bias_add_the_residual_once(tiny_model_dir, semantic_kernels,
                                                                         monkeypatch):
    import mlx.nn as nn

    from engine import cuda_qmv_split

    def split(inputs, template, output_shapes, output_dtypes, **_):  # MLX's product, whatever the split
        semantic_kernels.append("split")
        x, w, scales, biases = inputs[:4]
        t = dict(template)
        out = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=t["GS"], bits=t["BITS"])
        return [out.reshape(output_shapes[0]).astype(output_dtypes[0])]

    split_residual = cuda_qmv._residual_kernel()  # semantic_kernels' stand-in: the product plus the residual

    def split_plus(inputs, **options):
        semantic_kernels.append("split")
        return split_residual(inputs, **options)

    monkeypatch.setattr(cuda_qmv_split, "_kernel", lambda: split)
    monkeypatch.setattr(cuda_qmv_split, "_residual_kernel", lambda: split_plus)
    monkeypatch.setattr(cuda_qmv_split, "split_k", lambda n, k, bits, rows=1: 2)
    model = quantized_model(tiny_model_dir)
    expected = forward(ComputePath(quantized_model(tiny_model_dir), kernels=OURS), [7])
    before = len(semantic_kernels)
    got = forward(ComputePath(model, kernels=DecodeKernels(**{**FUSED.__dict__, "qmv_split": True})), [7])
    launched = semantic_kernels[before:]
    assert launched.count("qmv+residual") == 2 * len(model.layers) and launched.count("split") == 7 * len(model.layers)
    assert mx.allclose(got, expected, atol=1e-4).item()
    biased = nn.QuantizedLinear(128, 64, bias=True, group_size=64, bits=4)
    biased.bias = mx.random.normal((64,), key=mx.random.key(3))
    x, r = mx.random.normal((1, 1, 128), key=mx.random.key(4)), mx.random.normal((1, 1, 64), key=mx.random.key(5))
    before = len(semantic_kernels)
    for kernel in (cuda_qmv, cuda_qmv_split):  # the bias first, then the residual, in MLX's order; one launch each
        assert mx.allclose(kernel.linear_product(biased, x, r), r + biased(x), atol=1e-5).item()
    assert semantic_kernels[before:] == ["qmv", "split"]
