"""Linears of one input in one launch (`engine.fused_linears`: a block's q, k, v; its MLP's gate and up).

MLX's `cuda_kernel` has no CPU build: the fused kernels are replaced by stand-ins (fakes, named as such)
that compute what they are meant to from the inputs and template they are given, and record their calls;
the kernels' own device code is compiled in test_cuda_compile.py and checked against these products at load
(`engine.decode_measure`)."""
from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn
import pytest
from test_compiled import greedy
from test_decode_kernels import DENSE
from test_linear_mode import quantized_model
from test_traced_step import OURS, TRACED

from engine import cuda_qk_rope, cuda_qmv, decode_measure, fused_linears
from engine.compute import ComputePath
from engine.decode_choice import DecodeKernels, choose_kernels
from engine.step_measure import check_traced_step, filled_cache


def _product(x, w, scales, biases, template):
    return mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=template["GS"], bits=template["BITS"])


@pytest.fixture
def fused_kernels(semantic_kernels, monkeypatch):
    """The fused kernels' stand-ins beside `semantic_kernels`' (conftest.py: our linears, attention and write);
    the calls land in the same record ("three", "glu")."""
    calls = semantic_kernels

    def three(inputs, template, output_shapes, output_dtypes, **_):
        calls.append("three")
        t, x = dict(template), inputs[0]
        return [_product(x, *inputs[1 + 3 * i:4 + 3 * i], t).reshape(shape).astype(dtype)
                for i, (shape, dtype) in enumerate(zip(output_shapes, output_dtypes))]

    def glu(inputs, template, output_shapes, output_dtypes, **_):
        calls.append("glu")
        t, x = dict(template), inputs[0]
        gate, up = (_product(x, *inputs[1 + 3 * i:4 + 3 * i], t).astype(mx.float32) for i in range(2))
        return [(nn.silu(gate) * up).reshape(output_shapes[0]).astype(output_dtypes[0])]

    def qk_rope(inputs, template, **_):  # MLX's own norm and RoPE, from what the kernel is given
        calls.append("qk_rope+norm" if dict(template)["NORM"] else "qk_rope")
        t, (q, k, q_weight, k_weight, offset, constants) = dict(template), inputs

        def turned(x, heads, weight):
            x = x.reshape(1, 1, heads, t["D"])
            x = mx.fast.rms_norm(x, weight, constants[1].item()) if t["NORM"] else x
            return mx.fast.rope(x.transpose(0, 2, 1, 3), t["D"], traditional=False, base=2 ** constants[0].item(),
                                scale=1.0, offset=offset[0])
        return [turned(q, t["H"], q_weight), turned(k, t["KV"], k_weight)]

    monkeypatch.setattr(cuda_qmv, "_three_kernel", lambda: three)
    monkeypatch.setattr(cuda_qmv, "_glu_kernel", lambda: glu)
    monkeypatch.setattr(cuda_qk_rope, "_kernel", lambda: qk_rope)
    return calls


@pytest.fixture(scope="module")
def q4(tiny_model_dir):
    return quantized_model(tiny_model_dir)


def test_one_launch_gives_each_linears_product(q4, fused_kernels):
    attention, mlp = q4.layers[0].self_attn, q4.layers[0].mlp
    qkv = (attention.q_proj, attention.k_proj, attention.v_proj)
    for rows in (1, 3):  # 3 rows: padded to the 4-row bucket and cut back
        x = mx.random.normal((1, rows, qkv[0].weight.shape[1] * 8), key=mx.random.key(rows))
        for got, linear in zip(cuda_qmv.three(x, qkv), qkv):
            assert got.shape == (1, rows, linear.weight.shape[0])
            assert mx.allclose(got, linear(x), atol=1e-5).item()
        expected = nn.silu(mlp.gate_proj(x)) * mlp.up_proj(x)
        assert mx.allclose(cuda_qmv.glu(x, mlp.gate_proj, mlp.up_proj), expected, atol=1e-5).item()
    assert fused_kernels.count("three") == fused_kernels.count("glu") == 2
    biased = nn.QuantizedLinear(qkv[0].weight.shape[1] * 8, 64, bias=True)  # qwen2's q, k and v have biases
    biased.bias = mx.ones(64)
    x = mx.random.normal((1, 1, qkv[0].weight.shape[1] * 8), key=mx.random.key(9))
    assert mx.allclose(cuda_qmv.three(x, (biased, biased, biased))[2], biased(x), atol=1e-5).item()
    assert not cuda_qmv.fusable((biased, biased), mx.float32)  # the gated MLP's kernel adds no bias
    assert not cuda_qmv.fusable((qkv[0], nn.QuantizedLinear(qkv[0].weight.shape[1] * 8, 64, bits=8)), mx.float32)
    assert not cuda_qmv.fusable((mlp.gate_proj, qkv[1]), mx.float32)  # gate and up of one width only
    plain = nn.Linear(qkv[0].weight.shape[1] * 8, 64)  # an unquantized linear: not our kernel's
    assert not cuda_qmv.fusable((plain, plain, plain), mx.float32)


def test_a_decode_forward_fuses_each_blocks_linears_and_computes_the_same(q4, fused_kernels):
    fused = ComputePath(q4, kernels=DecodeKernels(qmv=True, qmv_fused=True, source="setting"))
    plain = ComputePath(q4, kernels=DecodeKernels(qmv=True, source="setting"))
    assert fused.identity().endswith("kernels=qmv+qmv_fused")
    caches = [filled_cache(q4, DENSE, 16, 100, mx.float32) for _ in range(2)]
    expected = greedy(lambda t, c: plain.forward(t, c, "last"), caches[0], 6)
    before = len(fused_kernels)
    got = greedy(lambda t, c: fused.forward(t, c, "last"), caches[1], 6)
    layers = len(q4.layers)
    assert fused_kernels[before:].count("three") == fused_kernels[before:].count("glu") == 6 * layers
    assert got[0] == expected[0]
    assert max(mx.abs(a - b).max().item() for a, b in zip(expected[1], got[1])) < 1e-4
    before = len(fused_kernels)
    fused.forward(mx.zeros((1, 12), dtype=mx.uint32), caches[1])  # more rows than the kernels take: the layers'
    assert "three" not in fused_kernels[before:] and "glu" not in fused_kernels[before:]


ALL_FUSED = DecodeKernels(qmv=True, qmv_fused=True, rope_fused=True, source="setting")


def decoded_both_ways(model, kernels, calls, steps: int, dtype=mx.float16):
    """`steps` greedy tokens (and logits) from equal half-precision caches, our linears alone and with `kernels`;
    and the kernel calls the second made."""
    plain = ComputePath(model, kernels=DecodeKernels(qmv=True, source="setting"))
    fused = ComputePath(model, kernels=kernels)
    caches = [filled_cache(model, DENSE, 16, 100, dtype) for _ in range(2)]
    expected = greedy(lambda t, c: plain.forward(t, c, "last"), caches[0], steps)
    before = len(calls)
    got = greedy(lambda t, c: fused.forward(t, c, "last"), caches[1], steps)
    return expected, got, calls[before:]


def test_one_tokens_norms_and_rope_take_one_launch_in_half_precision(tiny_model_dir, fused_kernels, caplog,
                                                                      monkeypatch):
    """The rotation kernel serves float16/bfloat16 activations only: a float16 copy of the model."""
    model = quantized_model(tiny_model_dir)
    model.set_dtype(mx.float16)
    attention = model.layers[0].self_attn
    assert cuda_qk_rope.takes(attention, mx.float16) and not cuda_qk_rope.takes(attention, mx.float32)
    expected, got, calls = decoded_both_ways(model, ALL_FUSED, fused_kernels, 5)
    assert calls.count("qk_rope") == 5 * len(model.layers)
    assert got[0] == expected[0]
    for a, b in zip(expected[1], got[1]):  # float16, and the fused activation rounded once: near, not equal
        assert (mx.linalg.norm((a - b).astype(mx.float32)) / mx.linalg.norm(a.astype(mx.float32))).item() < 5e-3
    assert set(decode_measure._time_rope(model, mx.float16)) == {"rope_fused"}  # the rotation checked and timed

    def unturned(inputs, template, **_):  # never rotated (llama: no norms): the load-time check refuses it
        t = dict(template)
        return [x.reshape(1, 1, n, t["D"]).transpose(0, 2, 1, 3)
                for x, n in ((inputs[0], t["H"]), (inputs[1], t["KV"]))]

    monkeypatch.setattr(cuda_qk_rope, "_kernel", lambda: unturned)
    with caplog.at_level(logging.WARNING, logger="engine.decode_measure"):
        assert decode_measure._time_rope(model, mx.float16) == {}
        assert set(decode_measure._time_fused(model, mx.float16)) == {"qmv_fused"}  # measured apart: still in
    assert "our rope_fused kernel disagrees with MLX's" in caplog.text


def tiny_qwen3(dtype) -> nn.Module:
    """A 2-layer qwen3 (per-head q and k norms, with random weights), 4-bit, in `dtype`."""
    from mlx_lm.models import qwen3

    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6,
                           vocab_size=512, rope_theta=1e6, max_position_embeddings=4096, tie_word_embeddings=False)
    model = qwen3.Model(args)
    for i, layer in enumerate(model.layers):
        for j, norm in enumerate((layer.self_attn.q_norm, layer.self_attn.k_norm)):
            norm.weight = 1 + 0.5 * mx.random.normal(norm.weight.shape, key=mx.random.key(40 + 2 * i + j))
    nn.quantize(model, group_size=64, bits=4)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def test_a_qwen3_blocks_per_head_norms_are_in_the_rotation_launch(fused_kernels, caplog, monkeypatch):
    model = tiny_qwen3(mx.float16)
    assert cuda_qk_rope.takes(model.layers[0].self_attn, mx.float16)
    expected, got, calls = decoded_both_ways(model, ALL_FUSED, fused_kernels, 5)
    assert calls.count("qk_rope+norm") == 5 * len(model.layers)
    assert got[0] == expected[0]
    assert set(decode_measure._time_rope(model, mx.float16)) == {"rope_fused"}
    alone = DecodeKernels(qmv=True, rope_fused=True, source="setting")  # no qmv_fused
    assert ComputePath(model, kernels=alone).identity().endswith("kernels=qmv+rope_fused")
    expected, got, calls = decoded_both_ways(model, alone, fused_kernels, 3)
    assert calls.count("qk_rope+norm") == 3 * len(model.layers) and "three" not in calls and "glu" not in calls
    assert got[0] == expected[0]

    def norms_swapped(inputs, template, **options):  # the keys' norm weights on the queries and back
        q, k, q_weight, k_weight, *rest = inputs
        return kernel(inputs=[q, k, k_weight, q_weight, *rest], template=template, **options)

    kernel = cuda_qk_rope._kernel()
    monkeypatch.setattr(cuda_qk_rope, "_kernel", lambda: norms_swapped)
    with caplog.at_level(logging.WARNING, logger="engine.decode_measure"):
        assert decode_measure._time_rope(model, mx.float16) == {}
    assert "disagrees" in caplog.text


def test_a_traced_step_holds_the_fused_launches(q4, fused_kernels):
    traced = ComputePath(q4, kernels=DecodeKernels(**{**TRACED.__dict__, "qmv_fused": True}), compiled=True)
    plain = ComputePath(q4, kernels=OURS)
    caches = [filled_cache(q4, DENSE, 8, 200, mx.float32) for _ in range(2)]
    check_traced_step(lambda t, c: plain.forward(t, c), traced.decode_step, *caches)  # the load-time check passes
    assert "three" in fused_kernels and "glu" in fused_kernels  # (the trace was made with them)
    expected = greedy(lambda t, c: plain.forward(t, c, "last"), caches[0], 8)
    before = len(fused_kernels)
    got = greedy(lambda t, c: traced.forward(t, c, "last"), caches[1], 8)
    assert fused_kernels[before:] == []  # replayed
    assert got[0] == expected[0]


def test_fused_linears_run_only_beside_ours_and_where_measured_faster(q4, fused_kernels):
    chosen, notes = choose_kernels({"qmv_fused": (2e-3, 1e-3)})
    assert not chosen["qmv_fused"] and "kernels: qmv_fused needs qmv" in notes
    chosen, _ = choose_kernels({"qmv": (2e-3, 1e-3), "qmv_fused": (2e-3, 1e-3)})
    assert chosen["qmv_fused"]
    timing = decode_measure._time_fused(q4, mx.float32)
    assert set(timing) == {"qmv_fused"} and all(seconds > 0 for seconds in timing["qmv_fused"])
    assert fused_linears.wire(q4) == len(q4.layers)


def test_only_mlps_whose_activation_is_silu_are_fused(q4, fused_kernels):
    """Gemma's MLPs have the same three projections and another activation (gelu): never wired, never measured."""
    from mlx_lm.models import gemma3_text

    args = gemma3_text.ModelArgs(model_type="gemma3_text", hidden_size=128, num_hidden_layers=2,
                                 intermediate_size=256, num_attention_heads=2, head_dim=64, rms_norm_eps=1e-6,
                                 vocab_size=512, num_key_value_heads=1)
    gemma = gemma3_text.Model(args)
    nn.quantize(gemma, group_size=64, bits=4)
    assert "gate_proj" in gemma.layers[0].mlp and fused_linears.wire(gemma) == 0
    assert decode_measure._time_fused(gemma, mx.float32) == {}
    assert fused_linears.wire(q4) == len(q4.layers)


def test_fused_linears_that_compute_otherwise_are_left_out(q4, fused_kernels, monkeypatch):
    def wrong(inputs, output_shapes, output_dtypes, **_):
        return [mx.ones(output_shapes[0], dtype=output_dtypes[0])]

    monkeypatch.setattr(cuda_qmv, "_glu_kernel", lambda: wrong)
    assert decode_measure._time_fused(q4, mx.float32) == {}
