"""Our CUDA decode kernels on the CPU build: the measured choice, its cache, the fallback, the fingerprint,
the plumbing that routes a one-query 8-bit fetch to the kernel (and back to MLX where it cannot run),
and decode pipelined one step ahead. The kernels themselves run only on MLX's CUDA backend: they are
checked against MLX there by `engine.decode_choice` at every measurement and by bench/gpu_kernels.py."""
from __future__ import annotations

import logging

import mlx.core as mx
import pytest
from test_linear_mode import Timings, quantized_model

from engine import (chunk_measure, cuda_attention, cuda_attention_mma, cuda_backend, cuda_chunk_attention,
                    cuda_kv_write, decode_choice, decode_kernels)
from engine.compute import ComputePath, choose, exact
from engine.compute_options import ComputeOptions
from engine.decode_choice import DecodeKernels, decide, resolve
from engine.decode_kernels import Q8Rows
from engine.generate import decode, prefill
from engine.kv import cache_offset
from engine.linear_mode_cache import LinearModeCache
from engine.sampling import RepetitionPenalty, greedy
from engine.window import QuantizedWindowKVCache, WindowPolicy, make_window_cache, set_dense_from

QMV_WINS = {"qmv": (2e-3, 1e-3), "attention": (1e-3, 1.2e-3)}


@pytest.fixture(scope="module")
def q4_model(tiny_model_dir):
    return quantized_model(tiny_model_dir)


def test_each_kernel_runs_where_it_measured_faster_and_the_timings_are_kept_per_shape(q4_model, tmp_path,
                                                                                      monkeypatch):
    store = LinearModeCache(tmp_path / "linear-modes.json")
    timings = Timings(QMV_WINS)
    first = resolve(q4_model, "auto", measure=timings, cache=store, cuda=True)
    assert (first.qmv, first.attention, first.source) == (True, False, "measured")
    assert first.notes == ("kernels: attention slower than MLX", "kernels: attention_mma not measured here",
                           "kernels: attention_chunk not measured here", "kernels: kv_write not measured here",
                           "kernels: mlp_compiled not measured here", "kernels: step_traced not measured here",
                           "kernels: step_traced_bf16 not measured here", "kernels: qmv_fused not measured here",
                           "kernels: rope_fused not measured here", "kernels: attention_staged not measured here",
                           "kernels: attention_transposed not measured here",
                           "kernels: attention_chunk_q8 not measured here", "kernels: qmv_split not measured here",
                           "kernels: residual_fused not measured here")
    again = resolve(q4_model, "auto", measure=timings, cache=store, cuda=True)
    assert (again.qmv, again.source, timings.calls) == (True, "cached", 1)
    assert again.timings == first.timings
    # the load's cost is reported where it measured, and not where the cache answered
    assert first.measure_s > 0 and first.describe()["measure_s"] >= 0
    assert again.measure_s == 0.0 and again.describe()["measure_s"] == 0.0
    # changed kernel code (or the Python that calls it) is measured and checked again, not trusted from the cache
    monkeypatch.setattr(decode_choice, "code_version", lambda: "another version")
    assert resolve(q4_model, "auto", measure=timings, cache=store, cuda=True).source == "measured"
    assert timings.calls == 2
    # inside the margin is no win; a kernel the model could not run is not chosen
    assert decide({"qmv": (1.0, 0.97)}) == {"qmv": False, "attention": False, "attention_mma": False,
                                            "attention_chunk": False, "kv_write": False, "mlp_compiled": False,
                                            "step_traced": False, "step_traced_bf16": False, "qmv_fused": False,
                                            "rope_fused": False, "attention_staged": False,
                                            "attention_transposed": False, "attention_chunk_q8": False,
                                            "qmv_split": False, "residual_fused": False}


def test_a_model_of_the_same_blocks_but_fewer_layers_is_measured_again(q4_model, tiny_model_dir, tmp_path):
    # the traced step is timed on the whole model, whose host work per step grows with its layers: a
    # benchmark's 4-layer model of a shape must not hand its verdict to the 64-layer one
    store = LinearModeCache(tmp_path / "linear-modes.json")
    timings = Timings(QMV_WINS)
    shallow = quantized_model(tiny_model_dir)
    shallow.model.layers = shallow.model.layers[:1]
    assert len(q4_model.layers) > 1
    assert resolve(q4_model, "auto", measure=timings, cache=store, cuda=True).source == "measured"
    assert resolve(shallow, "auto", measure=timings, cache=store, cuda=True).source == "measured"
    assert resolve(q4_model, "auto", measure=timings, cache=store, cuda=True).source == "cached"
    assert timings.calls == 2


def test_the_chunk_attention_is_timed_at_key_counts_no_earlier_measurement_met(monkeypatch):
    # MLX keeps a cuDNN plan per key count: a second measurement in a process must not time MLX without it.
    # The kernel is CUDA's: a stand-in (masked MLX attention over the first `count` keys) takes its place here.

    timed_at, attend = [], mx.fast.scaled_dot_product_attention

    def stand_in(queries, keys, values, count, scale):  # (not through the spy: only MLX's timing is counted)
        return attend(queries, keys[..., :count, :], values[..., :count, :], scale=scale, mask="causal")

    def spy(queries, keys, values, **options):
        timed_at.append(keys.shape[2])
        return attend(queries, keys, values, **options)

    monkeypatch.setattr(chunk_measure, "ATTENTION_KEYS", 64)
    monkeypatch.setattr(chunk_measure, "CHUNK_CALLS", 1)
    monkeypatch.setattr(cuda_chunk_attention, "shape_problem", lambda *_: None)
    monkeypatch.setattr(cuda_chunk_attention, "chunk_attention", stand_in)
    monkeypatch.setattr(cuda_chunk_attention, "reference", stand_in)
    seen = []
    for _ in range(2):
        timed_at.clear()
        monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", spy)
        assert "attention_chunk" in chunk_measure.time_chunk_attention(2, 1, 128, mx.bfloat16)
        monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", attend)
        assert len(timed_at) == len(set(timed_at)) > 1  # each evaluation at a new count
        seen.append(set(timed_at))
    assert not seen[0] & seen[1]


def test_of_two_attention_kernels_that_beat_mlx_the_faster_runs_and_a_decode_forward_asks_for_it(q4_model, tmp_path):
    store = LinearModeCache(tmp_path / "linear-modes.json")
    mma_faster = resolve(q4_model, "auto", measure=Timings({"attention": (1e-3, 0.8e-3),
                                                            "attention_mma": (1e-3, 0.3e-3)}), cache=store, cuda=True)
    assert (mma_faster.attention, mma_faster.attention_mma) == (False, True)
    assert "kernels: attention slower than attention_mma" in mma_faster.notes
    assert ComputePath(q4_model, kernels=mma_faster).identity().endswith(" kernels=attention_mma")
    store = LinearModeCache(tmp_path / "other.json")
    cores_faster = resolve(q4_model, "auto", measure=Timings({"attention": (1e-3, 0.3e-3),
                                                              "attention_mma": (1e-3, 0.8e-3)}), cache=store, cuda=True)
    assert (cores_faster.attention, cores_faster.attention_mma) == (True, False)
    assert cores_faster.describe()["attention_mma"] is False
    seen = []
    for kernels in (mma_faster, cores_faster):
        with kernels.scope(rows=1):
            seen.append((decode_kernels.attention_on(), decode_kernels._mma.on()))
        with kernels.scope(rows=2):  # a prefill chunk: neither
            seen.append((decode_kernels.attention_on(), decode_kernels._mma.on()))
    assert seen == [(True, True), (False, False), (True, False), (False, False)]


def test_of_the_attention_kernels_that_beat_mlx_only_the_fastest_runs_and_a_one_token_forward_tries_it_first(
        q4_model, tmp_path):
    store = LinearModeCache(tmp_path / "linear-modes.json")
    three = {"attention": (1e-3, 0.8e-3), "attention_mma": (1e-3, 0.3e-3), "attention_staged": (1e-3, 0.2e-3),
             "kv_write": (1e-3, 0.2e-3)}
    staged = resolve(q4_model, "auto", measure=Timings(three), cache=store, cuda=True)
    assert (staged.attention, staged.attention_mma, staged.attention_staged, staged.kv_write) == (False, False, True,
                                                                                                   True)
    assert {"kernels: attention slower than attention_staged",
            "kernels: attention_mma slower than attention_staged"} <= set(staged.notes)
    assert ComputePath(q4_model, kernels=staged).identity().endswith(" kernels=kv_write+attention_staged")
    with staged.scope(rows=1):
        assert decode_kernels.attention_on() and decode_kernels.attention_kernels() == ("staged", "cores")
    with staged.scope(rows=2):  # a prefill chunk: none of them
        assert not decode_kernels.attention_on() and decode_kernels.attention_kernels() == ("cores",)
    store = LinearModeCache(tmp_path / "other.json")
    mma = resolve(q4_model, "auto", measure=Timings({**three, "attention_staged": (1e-3, 0.5e-3)}), cache=store,
                  cuda=True)
    assert (mma.attention_mma, mma.attention_staged) == (True, False)
    assert "kernels: attention_staged slower than attention_mma" in mma.notes
    with mma.scope(rows=1):
        assert decode_kernels.attention_kernels() == ("mma", "cores")
    store = LinearModeCache(tmp_path / "third.json")
    transposed = resolve(q4_model, "auto", measure=Timings({**three, "attention_transposed": (1e-3, 0.1e-3)}),
                         cache=store, cuda=True)
    assert (transposed.attention_staged, transposed.attention_transposed) == (False, True)
    assert "kernels: attention_staged slower than attention_transposed" in transposed.notes
    assert ComputePath(q4_model, kernels=transposed).identity().endswith(" kernels=kv_write+attention_transposed")
    with transposed.scope(rows=1):
        assert decode_kernels.attention_kernels() == ("transposed", "cores")


def test_the_in_place_cache_write_is_measured_asked_for_by_one_token_forwards_and_named_in_the_identity(
        q4_model, tmp_path, monkeypatch):
    store = LinearModeCache(tmp_path / "linear-modes.json")
    both = {"attention_mma": (1e-3, 0.3e-3), "kv_write": (1e-3, 0.2e-3)}
    wins = resolve(q4_model, "auto", measure=Timings(both), cache=store, cuda=True)
    assert wins.kv_write and wins.describe()["kv_write"] is True
    assert ComputePath(q4_model, kernels=wins).identity().endswith(" kernels=attention_mma+kv_write")
    seen = []
    for rows in (1, 2, 40):
        with wins.scope(rows):
            seen.append(decode_kernels.kv_write_on())
    assert seen == [True, False, False]  # a prefill chunk or a verify forward keeps MLX's slice updates
    loses = resolve(q4_model, "auto", measure=Timings({**both, "kv_write": (1e-3, 0.99e-3)}),
                    cache=LinearModeCache(tmp_path / "other.json"), cuda=True)
    assert not loses.kv_write and "kernels: kv_write slower than MLX" in loses.notes
    # its one reader in a step is our attention (which takes the write's output): never without it
    alone = resolve(q4_model, "auto", measure=Timings({"kv_write": (1e-3, 0.2e-3)}),
                    cache=LinearModeCache(tmp_path / "third.json"), cuda=True)
    assert not alone.kv_write and "kernels: kv_write needs our attention" in alone.notes
    row = mx.zeros((1, 8, 1, 128), dtype=mx.bfloat16)
    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: False)
    assert cuda_kv_write.shape_problem(row, 8) == "not MLX's CUDA backend"
    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: True)
    assert cuda_kv_write.shape_problem(row, 8) is None and cuda_kv_write.shape_problem(row, 16) == "16-bit cache"
    assert cuda_kv_write.shape_problem(mx.zeros((1, 8, 2, 128)), 8) == "1 x 2 rows"
    assert cuda_kv_write.shape_problem(mx.zeros((1, 8, 1, 48)), 8) == "head dim 48, group 64"
    assert cuda_kv_write.shape_problem(row, 4) == "4-bit cache"


def test_the_tensor_core_attention_takes_its_shapes_and_splits_the_keys_in_whole_tiles():
    assert cuda_attention_mma.shape_problem(8, 128, 64) is None  # Qwen3-32B: 64 query heads over 8 KV heads
    assert cuda_attention_mma.shape_problem(16, 128, 64) is None
    assert cuda_attention_mma.shape_problem(32, 128, 64) == "32 query heads per KV head"
    assert cuda_attention_mma.shape_problem(8, 64, 64) == "head dim 64, group 64"
    assert cuda_attention_mma.shape_problem(8, 128, 32) == "head dim 128, group 32"
    for n in (1, 15, 16, 4097, 131072):
        size = cuda_attention_mma.split_size(n, kv_heads=8)
        assert size % cuda_attention_mma.TILE == 0 and size >= 128  # each split's partial output is read back
        assert -(-n // size) * 8 <= 1024  # about as many warps as the GPU holds at once, however long the cache
    assert cuda_attention_mma.split_size(131072, kv_heads=8) == 1024


def test_the_chunk_attention_takes_bf16_heads_of_128_and_splits_the_keys_in_whole_tiles():
    assert cuda_chunk_attention.shape_problem(45, 8, 128, mx.bfloat16) is None  # a question, Qwen3-32B's groups
    assert cuda_chunk_attention.shape_problem(5, 8, 128, mx.float16) == "head dim 128, mlx.core.float16 cache"
    assert cuda_chunk_attention.shape_problem(5, 8, 64, mx.bfloat16) == "head dim 64, mlx.core.bfloat16 cache"
    for n in (1, 33, 4097, 131072):
        for blocks_per_split in (8, 24):  # 8 KV heads x 1 or 3 blocks of 128 query rows
            size = cuda_chunk_attention.split_size(n, blocks_per_split)
            assert size % cuda_chunk_attention.TILE == 0 and size >= 256
            assert -(-n // size) * blocks_per_split <= 528  # about four blocks per SM, however long the cache
    queries = mx.zeros((1, 64, 5, 128), dtype=mx.bfloat16)
    keys = mx.zeros((1, 8, 512, 128), dtype=mx.bfloat16)
    with pytest.raises(ValueError, match="5 queries, 3 of 512 keys"):  # fewer keys than the chunk's own
        cuda_chunk_attention.chunk_attention(queries, keys, keys, 3, 1.0)
    with pytest.raises(ValueError, match="float16 cache"):
        cuda_chunk_attention.chunk_attention(queries, keys.astype(mx.float16), keys, 100, 1.0)


def test_settings_and_the_cpu_leave_nothing_to_choose(q4_model, tmp_path, caplog):
    store = LinearModeCache(tmp_path / "linear-modes.json")
    never = Timings(QMV_WINS)
    assert resolve(q4_model, "mlx", measure=never, cache=store, cuda=True) == DecodeKernels(source="setting")
    forced = resolve(q4_model, "codectx", measure=never, cache=store, cuda=True)
    assert (forced.qmv, forced.attention, forced.source) == (True, True, "setting")
    # forced, the in-place write still needs our attention to read the rows: not for heads it does not take
    assert not forced.kv_write and "kernels: kv_write needs our attention" in forced.notes[0]
    cpu = resolve(q4_model, "codectx", measure=never, cache=store)  # this machine: MLX's CPU backend
    assert (cpu.qmv, cpu.attention, cpu.notes) == (False, False, ("kernels: ours need MLX's CUDA backend",))
    assert resolve(q4_model, "auto", measure=never, cache=store).source == "not CUDA" and never.calls == 0

    def broken(model):
        raise RuntimeError("our qmv kernel disagrees with MLX's (relative error 3.1e-01)")

    with caplog.at_level(logging.WARNING, logger="engine.decode_choice"):
        fallback = resolve(q4_model, "auto", measure=broken, cache=store, cuda=True)
    assert (fallback.qmv, fallback.attention, fallback.source) == (False, False, "fallback")
    assert "disagrees" in fallback.notes[0] and "measuring failed" in caplog.text
    assert fallback.measure_s > 0  # the failed attempt's seconds are reported, not hidden as 0


def test_forcing_our_kernels_writes_in_place_only_for_heads_our_attention_takes(q4_model, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_attention, "cuda_available", lambda: True)
    store = LinearModeCache(tmp_path / "linear-modes.json")
    for shape, written in (((64, 8, 128), True), ((64, 8, 64), False), ((128, 4, 128), False)):
        monkeypatch.setattr(decode_choice, "attention_shape", lambda model, shape=shape: shape)
        assert resolve(q4_model, "codectx", cache=store, cuda=True).kv_write is written, shape


def test_what_runs_is_in_the_path_identity_so_checkpoints_never_mix(q4_model):
    plain = exact(q4_model)
    ours = ComputePath(q4_model, kernels=DecodeKernels(True, False, "setting"))
    both = ComputePath(q4_model, kernels=DecodeKernels(True, True, "setting"))
    assert ours.identity() == f"{plain.identity()} kernels=qmv"
    assert both.identity().endswith(" kernels=qmv+attention")
    assert len({plain.identity(), ours.identity(), both.identity()}) == 3
    on_cpu = choose(q4_model, ComputeOptions(attention="mlx", linear="quantized"))
    assert on_cpu.identity() == plain.identity().replace("compile=off", "compile=on")  # nothing chosen or added
    with pytest.raises(ValueError, match="kernels must be one of"):
        ComputeOptions(kernels="triton")


def test_a_one_query_fetch_hands_the_kernel_the_8bit_rows_where_they_lie():
    policy = WindowPolicy(True, 16, 16, 8, 0, "block")
    cache = QuantizedWindowKVCache(policy)
    kv = mx.random.normal((1, 2, 10, 64), key=mx.random.key(0))
    cache.update_and_fetch(kv, kv)
    one = mx.random.normal((1, 2, 1, 64), key=mx.random.key(1))
    with decode_kernels.scope(qmv=False, attention=True):
        keys, values = cache.update_and_fetch(one, one)
    assert isinstance(keys, Q8Rows) and isinstance(values, Q8Rows) and keys.n == values.n == 11
    assert keys[0] is cache.store.keys[0] and keys[0].shape[2] == 256  # the buffer, not a copy of 11 rows
    assert cache.bits == 8
    cache.trim(1)
    keys, _ = cache.update_and_fetch(one, one)  # outside the scope: MLX's own path, sliced rows
    assert not isinstance(keys, Q8Rows) and keys[0].shape[2] == 11


def test_forcing_the_kernels_where_they_cannot_run_computes_what_mlx_computes(q4_model):
    """On the CPU every call falls back: the 8-bit rows dequantized for MLX's attention, MLX's linears,
    MLX's slice updates for the cache write."""
    policy = WindowPolicy(True, 32, 32, 16, 0, "block")
    ids = [(7 * i + 3) % 500 for i in range(40)]
    runs = []
    for forced in (False, True):
        cache = make_window_cache(q4_model, policy, kv_bits=8)
        path = ComputePath(q4_model, kernels=DecodeKernels(forced, forced, "setting", kv_write=forced))
        logits = prefill(path, cache, ids, chunk_size=16)
        tokens = list(decode(path, cache, logits, greedy, 6))
        last = path.forward(mx.array([[tokens[-1]]]), cache, logits="last")
        runs.append((tokens, last.astype(mx.float32)))
    assert runs[0][0] == runs[1][0]
    assert mx.allclose(runs[0][1], runs[1][1], atol=2e-2).item()


DENSE = WindowPolicy(False, 0, 1, 0, 0, "block")


def test_short_chunks_reach_the_chunk_kernel_through_the_wired_attention_and_compute_what_mlx_computes(
        q4_model, monkeypatch):
    """The kernel needs CUDA; here a stand-in with its signature computes MLX's attention (the module's
    `reference`), so this checks the routing (which forwards reach it, with which keys) and that the wired
    call's own steps (projections, RoPE, the cache's update) give the model's output."""
    calls = []

    def stand_in(queries, keys, values, n, scale):
        calls.append((queries.shape[2], n))
        return cuda_chunk_attention.reference(queries, keys, values, n, scale).astype(queries.dtype)

    monkeypatch.setattr(cuda_chunk_attention, "chunk_attention", stand_in)
    monkeypatch.setattr(cuda_chunk_attention, "shape_problem", lambda *shape: None)  # the tiny model's heads
    monkeypatch.setattr(decode_choice, "resolve", lambda model, setting: DecodeKernels(source="measured",
                                                                                          attention_chunk=True))
    path = choose(q4_model, ComputeOptions(attention="mlx", linear="quantized", compile=False))
    assert path.kernels.attention_chunk and path.identity().endswith(" kernels=attention_chunk")
    seen = []
    for rows in (1, 2, decode_kernels.CHUNK_MAX_ROWS, decode_kernels.CHUNK_MAX_ROWS + 1):  # a longer chunk: cuDNN
        with path.kernels.scope(rows):
            seen.append(decode_kernels.chunk_on())
    assert seen == [False, True, True, False]
    ids = [(7 * i + 3) % 500 for i in range(40)]
    layers = len(q4_model.layers)
    results = []
    for compute in (exact(q4_model), path):
        cache = make_window_cache(q4_model, DENSE)
        logits = prefill(compute, cache, ids, chunk_size=16)
        results.append((logits.astype(mx.float32), list(decode(compute, cache, logits, greedy, 4))))
    assert calls == [(16, 16)] * layers + [(16, 32)] * layers + [(8, 40)] * layers  # decode steps: not chunks
    assert mx.allclose(results[0][0], results[1][0], atol=1e-4).item() and results[0][1] == results[1][1]
    calls.clear()
    prefill(path, make_window_cache(q4_model, DENSE, kv_bits=8), ids, chunk_size=16)
    assert calls == []  # 8-bit rows fetched for mlx-lm's quantized attention stay there
    windowed = make_window_cache(q4_model, WindowPolicy(True, 8, 8, 0, 0, "query"))
    set_dense_from(windowed, len(ids))
    prefill(path, windowed, ids, chunk_size=16)
    assert calls == [(16, 16)] * layers  # the first chunk is dense; the others keep their window's mask


def unpipelined(model, ids: list[int], n: int, penalty: RepetitionPenalty | None = None) -> list[int]:
    """Greedy decode one step at a time, each token read before the next forward (the reference)."""
    cache = make_window_cache(model, DENSE)
    logits, out = prefill(model, cache, ids), []
    for _ in range(n):
        token = int(mx.argmax(logits if penalty is None else penalty.apply(logits), axis=-1).item())
        out.append(token)
        if penalty is not None:
            penalty.observe((token,))
        logits = exact(model).forward(mx.array([[token]]), cache, logits="last")[:, -1, :]
    return out


def test_decode_pipelined_yields_the_unpipelined_tokens_and_the_cache_holds_what_it_yielded(tiny_loaded):
    model = tiny_loaded.model
    ids = [(11 * i + 5) % 500 for i in range(30)]
    cache = make_window_cache(model, DENSE)
    stream = decode(model, cache, prefill(model, cache, ids), greedy, 8)
    first = next(stream)
    assert cache_offset(cache) == len(ids)  # the first token comes before the second step is built
    first_three = [first, next(stream), next(stream)]
    assert cache_offset(cache) == len(ids) + 3  # the step after the third token is already queued
    assert first_three + list(stream) == unpipelined(model, ids, 8)
    assert cache_offset(cache) == len(ids) + 7  # max_tokens ended it: the last token is not in the cache


def test_with_a_repetition_penalty_each_step_waits_for_the_token_it_counts(tiny_loaded):
    model = tiny_loaded.model
    ids = [(13 * i + 2) % 500 for i in range(30)]
    cache = make_window_cache(model, DENSE)
    got = list(decode(model, cache, prefill(model, cache, ids), greedy, 10, penalty=RepetitionPenalty(1.5)))
    assert got == unpipelined(model, ids, 10, RepetitionPenalty(1.5)) and len(set(got)) > 1


def test_a_kernel_gets_a_new_name_when_its_source_or_its_signature_changes(monkeypatch):
    """Some MLX builds cache compiled kernels on disk by name; MLX writes the signature from the input
    and output names. (MLX's `cuda_kernel` has no CPU build: a stand-in records the names it is given.)"""
    names = []
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda name, **options: names.append(name))
    cuda_backend.kernel("k", "out[0] = a[0];", input_names=["a"], output_names=["out"])
    cuda_backend.kernel("k", "out[0] = a[0];", input_names=["a"], output_names=["out"])
    cuda_backend.kernel("k", "out[0] = a[0];", input_names=["a", "after"], output_names=["out"])
    cuda_backend.kernel("k", "out[0] = 2 * a[0];", input_names=["a"], output_names=["out"])
    assert names[0] == names[1] and len(set(names)) == 3 and all(n.startswith("k_") for n in names)
