"""The in-place 8-bit cache write's plumbing on the CPU: when a store may write a decode row in place,
what the reader is handed to order itself after the write, and which fetches never ask for it.

`engine.cuda_kv_write`'s kernel runs only on MLX's CUDA backend (checked against `mx.quantize` and MLX's
attention there by `engine.decode_choice` at every measurement, and by bench/gpu_kv_write.py). Here a
stand-in for that kernel, named `fake_kernel`, records its calls and returns an ordering token: it writes
nothing, so these tests assert the decisions and the plumbing, never the cache's contents after it."""
from __future__ import annotations

import mlx.core as mx
import pytest

from engine import cuda_kv_write, decode_kernels
from engine.decode_kernels import Q8Rows
from engine.qkv import QuantizedKVStore
from engine.window import QuantizedWindowKVCache, SlidingKVCache, WindowPolicy


@pytest.fixture
def fake_kernel(monkeypatch):
    """Stands in for the CUDA kernel (no CPU build): every row shape is taken; calls are recorded."""
    calls = []

    def write_q8(kbufs, vbufs, keys, values, start, group_size):
        calls.append(start)
        return mx.array([len(calls)], dtype=mx.int32)

    monkeypatch.setattr(cuda_kv_write, "shape_problem", lambda keys, bits, group_size=64: None)
    monkeypatch.setattr(cuda_kv_write, "write_q8", write_q8)
    return calls


def rows(n: int, seed: int, dim: int = 64) -> mx.array:
    return mx.random.normal((1, 2, n, dim), key=mx.random.key(seed))


def test_a_store_writes_in_place_only_when_asked_into_buffers_it_alone_holds_with_room(fake_kernel):
    store, one = QuantizedKVStore(), rows(1, 1)
    store.write(0, one, one, in_place=True)
    assert fake_kernel == []  # nothing to write into yet: a slice update makes the buffers
    store.write(1, rows(8, 2), rows(8, 2))
    store.write(9, one, one, in_place=True)
    assert fake_kernel == [9]
    keys, values = store.rows(10)
    assert keys.after is not None and values.after is None and keys.n == 10
    store.write(10, one, one)  # not asked: a slice update, and nothing for a reader to wait for
    assert fake_kernel == [9] and store.rows(11)[0].after is None
    views = store.state(11)  # views handed out: the buffers are no longer the store's alone
    store.write(11, one, one, in_place=True)
    assert fake_kernel == [9] and mx.array_equal(views[0], store.keys[0][..., :11, :]).item()
    store.write(12, one, one, in_place=True)  # the slice update's buffers are the store's again
    store.load(store.state(13))  # arrays from outside
    store.write(13, one, one, in_place=True)
    store.write(14, one, 2 * one.astype(mx.float16), in_place=True)  # values unlike the keys
    store.write(255, one, one, in_place=True)
    store.write(256, one, one, in_place=True)  # past the buffers' room: they grow by a slice update
    assert fake_kernel == [9, 12, 255]


def test_a_decode_fetch_asks_for_it_only_where_our_attention_is_the_one_reader(fake_kernel):
    policy = WindowPolicy(True, 16, 16, 8, 0, "block")
    cache = QuantizedWindowKVCache(policy)
    cache.update_and_fetch(rows(40, 3), rows(40, 3))  # a slice update: the buffers are the cache's
    one = rows(1, 4)
    with decode_kernels.scope(qmv=False, attention=True, kv_write=True):
        keys, _ = cache.update_and_fetch(one, one)
    assert fake_kernel == [40] and isinstance(keys, Q8Rows) and keys.after is not None
    with decode_kernels.scope(qmv=False, attention=True):  # the write not chosen
        cache.update_and_fetch(one, one)
    with decode_kernels.scope(qmv=False, attention=False, kv_write=True):  # MLX's attention reads it
        cache.update_and_fetch(one, one)
    assert fake_kernel == [40]
    windowed = QuantizedWindowKVCache(policy, dense_from=200)
    windowed.update_and_fetch(rows(60, 5), rows(60, 5))
    with decode_kernels.scope(qmv=False, attention=True, kv_write=True):
        fetched, _ = windowed.update_and_fetch(one, one)  # a windowed position: dequantized slices
        sliding = SlidingKVCache(8, QuantizedKVStore())
        sliding.update_and_fetch(rows(20, 6), rows(20, 6))
        window_rows, _ = sliding.update_and_fetch(one, one)  # a sliding layer reads through MLX
    assert fake_kernel == [40] and not isinstance(fetched, Q8Rows) and not isinstance(window_rows, Q8Rows)


def test_the_attention_is_handed_the_write_and_a_fallback_to_mlx_evaluates_it_first(fake_kernel, monkeypatch):
    """On the CPU our attention does not take the call: MLX's reads the rows, after the write is evaluated."""
    from mlx_lm.models import base

    from engine import cuda_attention

    decode_kernels.install()
    store = QuantizedKVStore()
    store.write(0, rows(16, 7), rows(16, 7))
    store.write(16, rows(1, 8), rows(1, 8), in_place=True)
    keys, values = store.rows(17)
    evaluated = []
    monkeypatch.setattr(mx, "eval", lambda *arrays: evaluated.extend(arrays))
    queries = mx.random.normal((1, 4, 1, 64), key=mx.random.key(9))
    out = base.quantized_scaled_dot_product_attention(queries, keys, values, 0.125, None, 64, 8)
    assert evaluated == [keys.after]
    monkeypatch.undo()
    expected = cuda_attention.reference(queries, keys, values, 17, 0.125, 64)
    assert mx.allclose(out, expected).item()


def test_the_load_time_check_passes_rows_as_mlx_quantizes_them_and_fails_a_row_not_written(fake_kernel, monkeypatch):
    """`engine.decode_measure`'s check of the write, its decisions on the CPU: a row MLX wrote passes the
    row check (each value within one step of its group); the stand-in writes nothing, so the check of an
    in-place write must fail: the row still holds what was there before (MLX's attention stands in for ours)."""
    from engine import cuda_attention, decode_measure

    store, row = QuantizedKVStore(), rows(1, 10, dim=128)
    store.write(0, rows(20, 11, dim=128), rows(20, 11, dim=128))
    store.write(20, row, row)
    written = store.read(20, 21)[0]
    decode_measure.check_quantized_row(written, row, 64)
    with pytest.raises(RuntimeError, match="more than a quantization step"):
        decode_measure.check_quantized_row(written, 2 * row, 64)

    def mlx_attention(queries, keys, values, n, scale, group_size, kernel="cores", after=None):
        return cuda_attention.reference(queries, keys, values, n, scale, group_size)

    monkeypatch.setattr(cuda_attention, "decode_attention", mlx_attention)
    query = mx.repeat(rows(1, 12, dim=128), 4, axis=1)
    with pytest.raises(RuntimeError, match="more than a quantization step"):
        decode_measure.check_kv_write(query, 2, rows(100, 13, dim=128), rows(1, 14, dim=128), "mma")
    assert fake_kernel == [100]


def test_a_prefill_leaves_the_buffers_the_stores_own_so_the_first_decode_row_may_go_in_place(fake_kernel):
    """The prefill evaluates what each chunk wrote without taking views of the buffers (`WindowKVCache.written`): a
    store's `state` marks them shared, and after the prefill's own evaluation did that the first decode step's row
    could not be written in place, so that step left the 8-bit trace (the first gap between tokens: 72-83 ms
    against 15 at the H200's pace, run q). Views a caller takes are still honoured."""
    from mlx_lm.models import llama

    from engine.generate import prefill

    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                           num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=256)
    model = llama.Model(args)
    cache = [QuantizedWindowKVCache(WindowPolicy(enabled=False)) for _ in range(args.num_hidden_layers)]
    prefill(model, cache, list(range(3, 40)), chunk_size=16, boundaries=[20])
    assert all(c.offset == 37 and c.store.in_place_ready(38) for c in cache)
    views = [c.state for c in cache]  # a caller's views (a checkpoint's copy): the next row is a slice update
    assert not any(c.store.in_place_ready(38) for c in cache) and len(views[0]) == 6
