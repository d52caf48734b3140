"""A decode step replayed from one trace over the engine's window caches (`engine.compiled`,
`engine.trace_caches`): with MLX's kernels it is checked here against the plain call, number for number;
with our CUDA kernels (no CPU build) it is checked against the plain call under stand-ins for the kernels,
named `semantic_kernels`, whose outputs carry the positions and key counts they are given, so a trace that
froze a step's position, or a kernel fed another count, would change the logits."""
from __future__ import annotations

import contextlib

import mlx.core as mx
import pytest
from test_compiled import greedy
from test_decode_kernels import DENSE
from test_linear_mode import Timings, quantized_model

from engine import cuda_kv_write, decode_choice, trace_caches
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
    assert (step.traces, step.fallbacks) == (2, 0)  # grown as a write grows them; traced at the new size
    caches[1][0].state  # a checkpoint's views: the next write may not go in place, so no trace for it
    greedy(lambda t, c: traced.forward(t, c, "last"), caches[1], 2)
    assert (step.traces, step.fallbacks) == (2, 1)
    assert ComputePath(model, kernels=TRACED).decode_step is None  # compute.compile off: nothing traced


def test_a_bf16_cache_traced_with_our_chunk_kernel_attends_over_each_steps_keys(tiny_model_dir, semantic_kernels,
                                                                                 monkeypatch):
    model = quantized_model(tiny_model_dir)
    chunked = DecodeKernels(qmv=True, attention_chunk=True, source="setting")
    plain = ComputePath(model, kernels=chunked)  # one query: MLX's attention over the rows
    sdpa = mx.fast.scaled_dot_product_attention  # given the queries as our kernel reads them (bf16)
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention",
                        lambda q, k, v, **options: sdpa(q.astype(mx.bfloat16).astype(q.dtype), k, v, **options))
    traced = ComputePath(model, kernels=DecodeKernels(**{**chunked.__dict__, "step_traced_bf16": True}), compiled=True)
    assert traced.identity().endswith("kernels=qmv+attention_chunk+step_traced_bf16")
    caches = [filled_cache(model, DENSE, 16, 200, mx.float32) for _ in range(2)]
    check_traced_step(lambda t, c: plain.forward(t, c), traced.decode_step, *caches)  # the load-time check passes
    expected = greedy(lambda t, c: plain.forward(t, c, "last"), caches[0], 60)  # 203 + 60 crosses 256 rows
    before = len(semantic_kernels)
    got = greedy(lambda t, c: traced.forward(t, c, "last"), caches[1], 60)
    assert semantic_kernels[before:].count("chunk") == len(caches[1])  # one trace made at the new size
    assert (traced.decode_step.traces, traced.decode_step.fallbacks) == (2, 0)
    assert got[0] == expected[0]  # (logits near bf16's precision: a fused trace may round a query otherwise)
    assert max(mx.abs(a - b).max().item() for a, b in zip(expected[1], got[1])) < 5e-3
    assert all(mx.allclose(a.state[0], b.state[0], atol=1e-3).item() for a, b in zip(*caches))


def test_a_model_whose_attention_is_not_wired_traces_no_bf16_step(monkeypatch):
    """The chunk kernel is reached through the wired attention call: without it the bf16 trace is dropped
    with the chunk attention, whatever was chosen or forced."""
    from spec_helpers import tiny_hybrid

    hybrid = tiny_hybrid(seed=1)
    monkeypatch.setattr(decode_choice, "resolve", lambda model, setting: DecodeKernels(
        qmv=True, attention_chunk=True, step_traced_bf16=True, rope_fused=True, source="setting"))
    path = choose(hybrid, ComputeOptions(attention="mlx"))
    assert not (path.kernels.attention_chunk or path.kernels.step_traced_bf16 or path.kernels.rope_fused)
    assert "step_traced_bf16" in path.notes[-1] and path.decode_step is None  # our linears, nothing traced
    assert "rope_fused" in path.notes[-1]  # (the rotation kernel runs from the same wired call)
    assert not decode_choice._chunk_kernel_takes_one_query(hybrid)  # so `codectx` does not force it either


def test_the_traced_step_runs_where_measured_faster_and_only_with_the_in_place_write(tiny_model_dir, tmp_path):
    model = quantized_model(tiny_model_dir)
    store = LinearModeCache(tmp_path / "linear-modes.json")
    wins = {"qmv": (2e-3, 1e-3), "attention": (1e-3, 0.5e-3), "kv_write": (1e-3, 0.5e-3),
            "step_traced": (30e-3, 20e-3)}
    chosen = resolve(model, "auto", measure=Timings(wins), cache=store, cuda=True)
    assert chosen.step_traced and chosen.identity().endswith("+step_traced")
    # the write lost alone, but the trace holding it won: both run (its own timing is of untraced steps)
    held = resolve(model, "auto", measure=Timings({**wins, "kv_write": (1e-3, 2e-3)}),
                   cache=LinearModeCache(tmp_path / "held.json"), cuda=True)
    assert held.step_traced and held.kv_write
    assert "kernels: kv_write slower alone, chosen for step_traced" in held.notes
    assert "kernels: kv_write slower than MLX" not in held.notes
    # ... and where the trace loses too, neither runs
    neither = resolve(model, "auto", measure=Timings({**wins, "kv_write": (1e-3, 2e-3), "step_traced": (20e-3, 30e-3)}),
                      cache=LinearModeCache(tmp_path / "neither.json"), cuda=True)
    assert not (neither.step_traced or neither.kv_write) and "kernels: kv_write slower than MLX" in neither.notes
    # a write that failed its check (no timing) is never held for the trace
    without_write = resolve(model, "auto", measure=Timings({k: v for k, v in wins.items() if k != "kv_write"}),
                            cache=LinearModeCache(tmp_path / "other.json"), cuda=True)
    assert not without_write.step_traced and "kernels: step_traced needs kv_write" in without_write.notes
    assert ComputePath(model, kernels=without_write, compiled=True).decode_step is None  # our kernels, no trace
    assert ComputePath(model, kernels=chosen, compiled=True).decode_step.ours
    assert decode_choice.resolve(model, "codectx", cuda=True).step_traced == decode_choice._our_attention_takes(model)


def test_the_load_time_measurement_times_both_steps_after_checking_the_traced_one(tiny_model_dir, semantic_kernels,
                                                                                   monkeypatch, caplog):
    from engine import step_measure

    monkeypatch.setattr(step_measure, "TRACE_KEYS", 1024)  # (the GPU's length guards against costs CPUs do not have)
    model = quantized_model(tiny_model_dir)
    plain_s, traced_s = time_traced_step(model, OURS)["step_traced"]
    assert plain_s > 0 and traced_s > 0
    assert time_traced_step(model, DecodeKernels(qmv=True, attention=True, source="setting")) == {}  # no write
    before = len(semantic_kernels)
    bf16 = time_traced_step(model, DecodeKernels(qmv=True, attention_chunk=True, source="setting"))
    assert set(bf16) == {"step_traced_bf16"} and min(bf16["step_traced_bf16"]) > 0
    # the kernel's one query held to MLX's once, the plain step it is checked against attending with the kernel
    # (three steps, every layer: decode_kernels.one_query_chunk), and the trace holding it (made once)
    assert semantic_kernels[before:].count("chunk") == 1 + 3 * len(model.layers) + len(model.layers)
    monkeypatch.setattr(trace_caches, "layer_buffers", lambda *layer: None)  # every step falls back
    assert time_traced_step(model, OURS) == {}
    assert "traced step (step_traced): the step was not replayed from its trace; not using it" in caplog.text


@pytest.mark.parametrize("bits", [16, 8])
def test_an_engine_answers_from_the_trace_as_without_it(tiny_loaded, bits):
    """Through `Engine` (MLX's layers and attention, window caches, checkpoints; a follow-up restores
    one), with the compiled step on and off: the same answers, and the traced step in use. (The verify
    step's trace is checked above: a random model's answers give prompt lookup nothing to draft.)"""
    from checkpoint_helpers import ask, repo_segments, run

    from engine.engine import Engine

    tok, window = tiny_loaded.tokenizer, WindowPolicy(global_tokens=16, window_tokens=32, dense_tail=16)
    repo = repo_segments(tok)
    answers, steps = {}, (0, 0)
    for compiled in (True, False):
        with Engine(tiny_loaded, prefill_chunk=16, kv_bits=bits, window=window,
                    compute=ComputeOptions(attention="mlx", compile=compiled)) as eng:
            answers[compiled] = [run(eng, ask(tok, repo, q), max_tokens=24) for q in ("Where is main?", "Why?")]
            if compiled:
                steps = (eng.compute.decode_step.traces, eng.compute.decode_step.fallbacks)
    assert [tokens for tokens, _ in answers[True]] == [tokens for tokens, _ in answers[False]]
    assert answers[True][1][1].metrics.cached_tokens > 0  # the follow-up restored a checkpoint
    assert steps[0] > 0 and steps[1] == 0  # every decode step traced


def test_numpy_attention_keeps_window_caches_on_the_plain_call(tiny_loaded):
    """Where the path's attention is NumPy's (the CPU's, for llama/qwen attention) it beats the trace's MLX
    attention over a window cache: only mlx-lm's `KVCache` is traced there."""
    model = tiny_loaded.model
    path = choose(model, ComputeOptions(attention="numpy", forward="mlx"))
    assert path.attention == "numpy" and path.decode_step is not None
    expected = greedy(lambda t, c: model(t, cache=c), prefilled(model, 8, 120, dense_from=0), 3)[0]
    assert greedy(lambda t, c: path.forward(t, c), prefilled(model, 8, 120, dense_from=0), 3)[0] == expected
    assert (path.decode_step.traces, path.decode_step.fallbacks) == (0, 3)


def test_a_store_writes_in_place_only_into_its_own_buffers_with_room_and_takes_a_traced_steps_back(monkeypatch):
    from engine.qkv import QuantizedKVStore

    monkeypatch.setattr(cuda_kv_write, "shape_problem", lambda keys, bits, group_size=64: None)
    store, rows = QuantizedKVStore(), mx.random.normal((1, 2, 250, 64), key=mx.random.key(3))
    store.write(0, rows, rows)  # a slice update: the buffers are the store's
    assert store.in_place_ready(251) and store.in_place_ready(256) and not store.in_place_ready(257)
    assert not store.in_place_ready(251, dtype=mx.float16)  # rows unlike the buffers
    views = store.state(250)  # a checkpoint's views
    assert not store.in_place_ready(251)
    store.reserve(300)  # grown as a write grows them: new buffers, the store's alone, the rows kept
    assert store.keys[0].shape[2] == 512 and store.in_place_ready(300)
    assert all(mx.array_equal(a, b).item() for a, b in zip(store.state(250), views))
    store.load(views)
    store.replace(*store.buffers())  # what a traced step hands back is the store's alone
    assert store.in_place_ready(250)
    monkeypatch.setattr(cuda_kv_write, "shape_problem", lambda keys, bits, group_size=64: "not this row")
    other = QuantizedKVStore()
    other.write(0, rows, rows)
    assert not other.in_place_ready(251)  # a row the kernel does not take


def test_the_load_time_measurement_times_the_trace_with_a_write_that_lost_alone_against_the_step_without_it(
        tiny_model_dir, monkeypatch):
    model = quantized_model(tiny_model_dir)
    lost = {"qmv": (2e-3, 1e-3), "attention": (1e-3, 0.5e-3), "kv_write": (1e-3, 2e-3)}
    monkeypatch.setattr(decode_choice, "measure_kernels", lambda m: dict(lost))
    monkeypatch.setattr(decode_choice.residual_measure, "measure", lambda m: {})
    monkeypatch.setattr(decode_choice.chunk_measure, "measure", lambda m, wirable: {})
    timed = []
    monkeypatch.setattr(decode_choice, "time_traced_step", lambda m, kernels, baseline: timed.append(
        (kernels, baseline)) or {"step_traced": (30e-3, 20e-3)})
    timings = decode_choice.measure_all(model)
    (kernels, baseline), = timed
    assert kernels.kv_write and not baseline.kv_write and kernels.attention and baseline.attention
    assert decode_choice.choose_kernels(timings)[0]["kv_write"]
    timed.clear()  # a write that failed its check is not held
    monkeypatch.setattr(decode_choice, "measure_kernels", lambda m: {k: v for k, v in lost.items() if k != "kv_write"})
    decode_choice.measure_all(model)
    assert not timed[0][0].kv_write


def test_the_bf16_trace_is_held_back_whatever_its_timing_and_forced_by_the_codectx_setting(tiny_model_dir, tmp_path,
                                                                                          monkeypatch):
    """Run h (H200): the bf16 trace won over 8,192 rows and lost at 131,072 keys (`decode_choice.HELD_BACK`)."""
    model = quantized_model(tiny_model_dir)
    timings = {"qmv": (2e-3, 1e-3), "attention_chunk": (1e-3, 0.2e-3), "step_traced_bf16": (18e-3, 12e-3)}
    chosen = resolve(model, "auto", measure=Timings(timings), cache=LinearModeCache(tmp_path / "m.json"), cuda=True)
    assert chosen.attention_chunk and not chosen.step_traced_bf16
    assert any(note.startswith("kernels: step_traced_bf16 held back: slower than the plain step at 131,072 keys")
               for note in chosen.notes)
    monkeypatch.setattr(decode_choice, "_chunk_kernel_takes_one_query", lambda model: True)
    assert decode_choice.resolve(model, "codectx", cuda=True).step_traced_bf16


def test_the_8bit_traces_reference_splits_its_keys_as_the_trace_does(tiny_model_dir, semantic_kernels, monkeypatch):
    """Run h (H200): over 8,192 rows the plain step split the keys over the count and the trace over the buffers'
    rows, and 64 random layers made that 4.86e-2 apart. The check's reference now splits as the trace does."""
    from engine import cuda_attention, decode_kernels

    counts = []
    real = cuda_attention.decode_attention
    monkeypatch.setattr(cuda_attention, "decode_attention", lambda q, k, v, n, *rest, **kw: counts.append(
        isinstance(n, mx.array)) or real(q, k, v, n, *rest, **kw))
    model = quantized_model(tiny_model_dir)
    path = ComputePath(model, kernels=OURS)
    cache = filled_cache(model, WindowPolicy(enabled=False), 8, 200, mx.float32)
    token = mx.array([[1]], dtype=mx.uint32)
    mx.eval(path.forward(token, cache))
    plain_counts, counts[:] = list(counts), []
    with decode_kernels.split_as_traced():
        mx.eval(path.forward(token, cache))
    assert plain_counts and not any(plain_counts)  # a plain step's count is the int it holds
    assert counts and all(counts)  # the reference's is an array, as a trace's


def test_a_write_held_for_the_8bit_trace_is_checked_inside_it_and_off_where_nothing_is_traced(
        tiny_model_dir, semantic_kernels, monkeypatch, tmp_path):
    """The trace holding the write is checked against a plain step with the same write, split as the trace splits
    (`decode_kernels.split_as_traced`, entered for each of the check's steps); only the timed baseline goes
    without the write. A path that traces nothing (``compute.compile`` off) does not run a write held for a trace."""
    from engine import decode_kernels, step_measure

    monkeypatch.setattr(step_measure, "TRACE_KEYS", 1024)
    entered = []
    real = decode_kernels.split_as_traced
    monkeypatch.setattr(decode_kernels, "split_as_traced", lambda: entered.append(1) or real())
    model = quantized_model(tiny_model_dir)
    baseline = DecodeKernels(**{**OURS.__dict__, "kv_write": False})
    assert set(time_traced_step(model, OURS, baseline=baseline)) == {"step_traced"}
    assert len(entered) == 3
    wins = {"qmv": (2e-3, 1e-3), "attention": (1e-3, 0.5e-3), "kv_write": (1e-3, 2e-3), "step_traced": (30e-3, 20e-3)}
    held = resolve(model, "auto", measure=Timings(wins), cache=LinearModeCache(tmp_path / "held.json"), cuda=True)
    monkeypatch.setattr(decode_choice, "resolve", lambda model, setting: held)
    untraced = choose(model, ComputeOptions(attention="mlx", compile=False))
    assert held.kv_write and not untraced.kernels.kv_write
    assert "kernels: kv_write off: held for a trace this path does not make" in untraced.notes
    assert choose(model, ComputeOptions(attention="mlx")).kernels.kv_write  # traced: it runs


def test_the_8bit_traces_reference_runs_its_mlps_as_the_trace_does(tiny_model_dir, semantic_kernels, monkeypatch):
    """Run j (H100, bench/gpu_trace_check.py): the trace equalled its own function run eagerly, and that function
    was 4.9e-2 from a reference whose MLPs replayed their own compiled trace (the residual added apart); with the
    MLPs run as the trace runs them, 0.0. The check's reference runs them so, whatever the timed step does."""
    from engine import compiled_mlp, decode_kernels, step_measure

    monkeypatch.setattr(step_measure, "TRACE_KEYS", 1024)
    mlps_apart = []
    real = decode_kernels.split_as_traced

    @contextlib.contextmanager
    def spied():  # the MLPs' switch as the reference's forward will see it: read on entering, inside its scope
        mlps_apart.append(compiled_mlp._on.on())
        with real():
            yield

    monkeypatch.setattr(decode_kernels, "split_as_traced", spied)
    model = quantized_model(tiny_model_dir)
    kernels = DecodeKernels(**{**OURS.__dict__, "mlp_compiled": True})
    with kernels.scope(1):
        assert compiled_mlp._on.on()  # the plain step's MLPs replay their own trace
    assert set(time_traced_step(model, kernels)) == {"step_traced"}
    assert mlps_apart == [False, False, False]  # the check's three reference steps
