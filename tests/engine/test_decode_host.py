"""What a decode step costs the host, on the CPU build: the MLX operations our kernels' wrappers add (none
around a decode row), the verdicts kept per linear, the timing records decode logs for the benchmarks, and
the MLPs replayed from a trace (`engine.compiled_mlp`). The kernels themselves run only on MLX's CUDA
backend; here stand-ins record what they are given."""
from __future__ import annotations

import logging

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from test_decode_kernels import DENSE, QMV_WINS
from test_linear_mode import Timings, quantized_model

from engine import (compiled_mlp, cuda_attention, cuda_attention_mma, cuda_backend, cuda_chunk_attention, cuda_qmv,
                    decode_choice)
from engine.compute import ComputePath
from engine.decode_choice import DecodeKernels, resolve
from engine.generate import decode, prefill
from engine.linear_mode_cache import LinearModeCache
from engine.sampling import RepetitionPenalty, greedy
from engine.window import make_window_cache


@pytest.fixture(scope="module")
def q4_model(tiny_model_dir):
    return quantized_model(tiny_model_dir)


def test_a_decode_row_reaches_the_vector_kernel_as_it_lies_and_its_verdict_is_asked_once(q4_model, monkeypatch):
    """A step's ~450 linears each cost the host an operation per reshape: one row (or a whole bucket of rows)
    goes to the kernel and comes back in the caller's shape with none; a row count between buckets is padded.
    (MLX's `cuda_kernel` has no CPU build: a stand-in records what the kernel is given.)"""
    calls = []

    def kernel(inputs, output_shapes, output_dtypes, template, **launch):
        calls.append((inputs[0], dict(template)["M"], output_shapes[0]))
        return [mx.zeros(output_shapes[0], dtype=output_dtypes[0])]

    monkeypatch.setattr(cuda_qmv, "_kernel", lambda: kernel)
    weight, scales = mx.zeros((96, 16), dtype=mx.uint32), mx.zeros((96, 2), dtype=mx.bfloat16)
    for shape in ((1, 1, 128), (1, 4, 128), (1, 3, 128)):
        x = mx.ones(shape, dtype=mx.bfloat16)
        y = cuda_qmv.qmv(x, weight, scales, scales, bits=4, group_size=64)
        assert y.shape == (*shape[:-1], 96)
    (one, m1, out1), (four, m4, out4), (three, m3, out3) = calls
    assert one.shape == (1, 1, 128) and (m1, out1) == (1, (1, 1, 96))  # the step's row as it lies
    assert four.shape == (1, 4, 128) and (m4, out4) == (4, (1, 4, 96))
    assert three.shape == (4, 128) and (m3, out3) == (4, (4, 96))  # three rows padded to the 4-row kernel
    with pytest.raises(ValueError, match="at most 8 rows"):
        cuda_qmv.qmv(mx.ones((9, 128), dtype=mx.bfloat16), weight, scales, scales, bits=4, group_size=64)
    asked = []
    monkeypatch.setattr(cuda_qmv, "unsupported", lambda linear, dtype: asked.append(dtype))
    linear = decode_choice.first_block_linears(q4_model)[0]
    linear.__dict__.pop("_codectx_qmv", None)
    try:
        verdicts = [cuda_qmv.takes(linear, dtype) for dtype in (mx.bfloat16, mx.bfloat16, mx.float16, mx.float16)]
        assert verdicts == [True] * 4 and asked == [mx.bfloat16, mx.float16]  # once per activation dtype
        assert "_codectx_qmv" not in linear.parameters() and "_codectx_qmv" not in linear
        monkeypatch.setattr(cuda_backend, "cuda_available", lambda: True)  # another backend: asked again
        assert cuda_qmv.takes(linear, mx.float16) and asked == [mx.bfloat16, mx.float16, mx.float16]
    finally:
        linear.__dict__.pop("_codectx_qmv", None)  # the module is shared by this file's tests


def test_our_attentions_read_the_query_and_write_the_output_as_they_lie(monkeypatch):
    """Their kernels read the query, and the merge writes the output, as flat rows: the caller's arrays go in
    and come out with no reshape (one MLX operation each, every layer of every step). (MLX's `cuda_kernel`
    has no CPU build: stand-ins record the shapes they are given.)"""
    seen = []

    def kernel(inputs, output_shapes, output_dtypes, **launch):
        seen.append((inputs[0].shape, output_shapes[0]))
        return [mx.zeros(shape, dtype=dtype) for shape, dtype in zip(output_shapes, output_dtypes)]

    for module, name in ((cuda_attention_mma, "_kernel"), (cuda_attention_mma, "_merge_kernel"),
                         (cuda_chunk_attention, "_kernel")):
        monkeypatch.setattr(module, name, lambda: kernel)
    eight_bit = tuple(mx.zeros((1, 8, 512, n), dtype=t) for n, t in ((32, mx.uint32), (2, mx.bfloat16),
                                                                   (2, mx.bfloat16)))
    query = mx.zeros((1, 64, 1, 128), dtype=mx.bfloat16)
    out = cuda_attention.decode_attention(query, eight_bit, eight_bit, 300, 0.1, 64, "mma")
    assert out.shape == (1, 64, 1, 128) and seen[0][0] == (1, 64, 1, 128) and seen[1][1] == (1, 64, 1, 128)
    chunk = mx.zeros((1, 5, 64, 128), dtype=mx.bfloat16).transpose(0, 2, 1, 3)  # as mlx-lm's attention hands it
    keys = mx.zeros((1, 8, 512, 128), dtype=mx.bfloat16)
    assert cuda_chunk_attention.chunk_attention(chunk, keys, keys, 300, 0.1).shape == (1, 64, 5, 128)
    assert seen[2][0] == (1, 64, 5, 128) and seen[3][1] == (1, 64, 5, 128)
    with pytest.raises(ValueError, match="one query of one sequence, got 2 x 1"):
        cuda_attention_mma.partial_attention(mx.concatenate([query, query]), eight_bit, eight_bit, 300, 0.1)
    with pytest.raises(ValueError, match="2 sequences"):
        cuda_chunk_attention.chunk_attention(mx.concatenate([chunk, chunk]), keys, keys, 300, 0.1)


def test_decode_logs_the_host_time_of_each_step_it_built_and_yields_the_same_tokens(tiny_loaded, caplog):
    """`decode_step` records (the benchmarks' view of decode): one per token read after a step was built."""
    model = tiny_loaded.model
    ids = [(13 * i + 2) % 500 for i in range(20)]
    runs = {}
    for level, penalty in ((logging.INFO, None), (logging.DEBUG, None), (logging.DEBUG, RepetitionPenalty(1.3))):
        caplog.clear()
        cache = make_window_cache(model, DENSE)
        with caplog.at_level(level, logger="engine.generate"):
            tokens = list(decode(model, cache, prefill(model, cache, ids), greedy, 5, penalty=penalty))
        steps = [r.decode_step for r in caplog.records if hasattr(r, "decode_step")]
        assert all(len(s) == 3 and min(s) >= 0 for s in steps)
        runs[(level, penalty is None)] = (tokens, len(steps))
    # pipelined: the first token is read before any step and the last after none; with a penalty each
    # token after the first is read after its own step
    assert runs[(logging.INFO, True)][1] == 0 and runs[(logging.DEBUG, True)][1] == 3
    assert runs[(logging.DEBUG, False)][1] == 4
    assert runs[(logging.INFO, True)][0] == runs[(logging.DEBUG, True)][0]


def test_decode_mlps_replay_their_trace_only_where_chosen_and_give_the_same_tokens(q4_model, tmp_path, caplog):
    """`engine.compiled_mlp`: measured like a kernel (only with our linears, which its trace holds), asked
    for by one-token forwards, and the same tokens and logits as the MLPs' own calls (on the CPU the
    trace holds MLX's linears)."""
    wins = resolve(q4_model, "auto", measure=Timings({**QMV_WINS, "mlp_compiled": (1e-3, 0.8e-3)}),
                   cache=LinearModeCache(tmp_path / "linear-modes.json"), cuda=True)
    assert wins.mlp_compiled and ComputePath(q4_model, kernels=wins).identity().endswith(" kernels=qmv+mlp_compiled")
    alone = resolve(q4_model, "auto", measure=Timings({"mlp_compiled": (1e-3, 0.8e-3)}),
                    cache=LinearModeCache(tmp_path / "other.json"), cuda=True)
    assert not alone.mlp_compiled and "kernels: mlp_compiled needs qmv" in alone.notes
    seen = []
    for kernels, rows in ((wins, 1), (wins, 2), (wins, 40), (DecodeKernels(mlp_compiled=True, source="setting"), 1)):
        with kernels.scope(rows):
            seen.append(compiled_mlp.on())
    assert seen == [True, False, False, False]  # one-token forwards only, and never without our linears
    ids = [(3 * i + 4) % 500 for i in range(40)]
    runs, traces = [], []
    try:
        for kernels in (DecodeKernels(source="setting"), DecodeKernels(qmv=True, mlp_compiled=True, source="setting")):
            path = ComputePath(q4_model, kernels=kernels)
            cache = make_window_cache(q4_model, DENSE)
            logits = prefill(path, cache, ids, chunk_size=16)
            tokens = list(decode(path, cache, logits, greedy, 6))
            runs.append((tokens, path.forward(mx.array([[tokens[-1]]]), cache, logits="last").astype(mx.float32)))
            traces.append(sum("_codectx_trace" in layer.mlp.__dict__ for layer in q4_model.layers))
        assert traces == [0, len(q4_model.layers)]  # prefill chunks never trace; every block's decode does
        assert runs[0][0] == runs[1][0] and mx.allclose(runs[0][1], runs[1][1], atol=1e-4).item()
        assert not any("_codectx" in name for name, _ in tree_flatten(q4_model.parameters()))
    finally:
        for layer in q4_model.layers:  # the model is shared by this file's tests
            layer.mlp.__dict__.pop("_codectx_trace", None)


@pytest.mark.parametrize("fails", ["tracing", "evaluating"])
def test_an_mlp_whose_trace_fails_keeps_its_own_call(q4_model, monkeypatch, caplog, fails):
    """A trace that cannot be made, or whose kernels MLX cannot compile when it first evaluates them (caught
    there by evaluating the first call, not in a later step), leaves the MLP on its own call, logged once."""
    compiled_mlp.wire(q4_model)
    mlp = q4_model.layers[0].mlp
    x = mx.ones((1, 1, q4_model.args.hidden_size))
    plain = mlp(x)  # outside the scope: its own call
    monkeypatch.setattr(compiled_mlp, "_warned", [])

    def fail(*args, **kwargs):
        raise RuntimeError("no kernel for this primitive")

    if fails == "tracing":
        monkeypatch.setattr(mx, "compile", lambda fn: fail)
    else:
        monkeypatch.setattr(mx, "eval", fail)
    try:
        with compiled_mlp.scope(True), caplog.at_level(logging.WARNING, logger="engine.compiled_mlp"):
            first, again = mlp(x), mlp(x)
        assert mlp.__dict__["_codectx_trace"] is compiled_mlp._FAILED
        assert mx.array_equal(first, plain).item() and mx.array_equal(again, plain).item()
        assert caplog.text.count("compiled MLP unavailable") == 1
    finally:
        mlp.__dict__.pop("_codectx_trace", None)
