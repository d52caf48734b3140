"""8-bit KV storage: fidelity against full precision, memory, and which attention path runs."""
from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from engine.qkv import DenseKVStore, QuantizedKVStore
from engine.window import QuantizedWindowKVCache, WindowPolicy, make_window_cache, set_dense_from

# Stated tolerance for 8-bit KV on the tiny random model (float32, logits of
# spread ~ +-4): max |logit difference| and top-1 agreement over all positions.
LOGIT_ATOL = 0.1
TOP1_AGREEMENT = 0.97


def tiny_llama(dtype=mx.float32) -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
        vocab_size=256, max_position_embeddings=4096,
    )
    mx.random.seed(0)
    model = llama.Model(args)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def run(model, tokens, caches, step):
    return mx.concatenate(
        [model(tokens[:, s:s + step], cache=caches) for s in range(0, tokens.shape[1], step)], axis=1
    )


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def tokens():
    mx.random.seed(2)
    return mx.random.randint(0, 256, (1, 320))


def test_8bit_prefill_and_decode_logits_within_tolerance_of_full_precision(model, tokens):
    ref = run(model, tokens, [KVCache() for _ in model.layers], 64)
    q8 = make_window_cache(model, WindowPolicy(enabled=False), 8)
    # 64-token prefill chunks, then 32 single-token decode steps over the 8-bit history.
    out = mx.concatenate([run(model, tokens[:, :288], q8, 64), run(model, tokens[:, 288:], q8, 1)], axis=1)
    diff = mx.abs(out - ref).max().item()
    agree = (out.argmax(-1) == ref.argmax(-1)).mean().item()
    assert 0 < diff < LOGIT_ATOL  # quantization does change the numbers, within bounds
    assert agree >= TOP1_AGREEMENT


def test_windowed_8bit_matches_windowed_full_precision(model, tokens):
    policy = WindowPolicy(global_tokens=16, window_tokens=32)
    fp, q8 = make_window_cache(model, policy, 16), make_window_cache(model, policy, 8)
    set_dense_from(fp, 256)
    set_dense_from(q8, 256)
    a, b = run(model, tokens, fp, 64), run(model, tokens, q8, 64)
    assert mx.abs(a - b).max().item() < LOGIT_ATOL


def test_memory_per_token_is_053_of_fp16():
    keys = mx.random.normal((1, 8, 1024, 128)).astype(mx.float16)
    fp16, q8 = KVCache(), QuantizedWindowKVCache(WindowPolicy())
    fp16.update_and_fetch(keys, keys)
    q8.update_and_fetch(keys, keys)
    ratio = q8.nbytes / fp16.nbytes
    # 64 one-byte codes + a float16 scale and bias per group of 64 = 68/128 bytes.
    assert ratio == pytest.approx(68 / 128, abs=1e-3)


def test_nbytes_counts_allocated_storage_in_steps():
    store = QuantizedKVStore()
    x = mx.zeros((1, 2, 10, 64), mx.float16)
    store.write(0, x, x)
    first = store.nbytes
    store.write(10, x, x)
    assert store.nbytes == first  # still inside the first 256-position step
    store.write(250, x, x)
    assert store.nbytes == 2 * first


def test_decode_reads_8bit_history_directly_and_prefill_does_not(model, tokens):
    cache = make_window_cache(model, WindowPolicy(), 8)[0]
    k = mx.random.normal((1, 2, 64, 64))
    fetched, _ = cache.update_and_fetch(k, k)
    assert not hasattr(cache, "bits")  # mlx-lm's attention takes the fused kernel
    assert isinstance(fetched, mx.array) and fetched.shape[2] == 64
    fetched, _ = cache.update_and_fetch(k[:, :, :1], k[:, :, :1])
    assert cache.bits == 8 and cache.group_size == 64  # quantized_matmul over 8-bit triples
    assert isinstance(fetched, tuple) and fetched[0].dtype == mx.uint32 and fetched[0].shape[2] == 65


def test_store_round_trip_error_is_bounded_by_one_step():
    x = mx.random.normal((1, 2, 300, 64))
    store = QuantizedKVStore()
    store.write(0, x, 2 * x)
    k, v = store.read(0, 300)
    step = (x.max(axis=-1, keepdims=True) - x.min(axis=-1, keepdims=True)) / 255
    # One quantization step of the group's range (mx.quantize rounds its zero point too).
    assert (mx.abs(k - x) <= step + 1e-6).all().item()
    assert mx.abs(k - x).mean().item() < step.mean().item() / 2
    assert k.shape == x.shape and v.dtype == x.dtype
    assert mx.array_equal(store.read(100, 120)[0], k[:, :, 100:120]).item()


def test_stores_overwrite_after_trim_semantics():
    for store in (DenseKVStore(), QuantizedKVStore()):
        a, b = mx.ones((1, 1, 8, 64)), -mx.ones((1, 1, 4, 64))
        store.write(0, a, a)
        store.write(4, b, b)  # what a cache does after trim(4)
        k, _ = store.read(0, 8)
        assert k[0, 0, :4].min().item() > 0.99 and k[0, 0, 4:].max().item() < -0.99


def test_a_restored_store_grows_on_its_first_write_keeping_its_rows_and_the_checkpoints():
    """A store loaded from another's state (a restore: the arrays end where the checkpoint ends) grows on its first
    write: the kept rows are the checkpoint's, the new rows follow them, the rest of the new capacity is zeros,
    and the checkpoint's own arrays are unchanged."""
    for store in (DenseKVStore(), QuantizedKVStore()):
        x = mx.random.normal((1, 2, 256, 64), key=mx.random.key(3))
        store.write(0, x, 2 * x)
        checkpoint = store.state(256)
        before = [mx.array(a) for a in checkpoint]
        restored = type(store)()
        assert restored.load(checkpoint) == 256
        new = mx.random.normal((1, 2, 45, 64), key=mx.random.key(4))
        restored.write(256, new, new)
        buffers = restored.keys if isinstance(restored.keys, tuple) else (restored.keys,)
        assert buffers[0].shape[2] == 512  # the next 256-position step
        k, v = restored.read(0, 301)
        k0, v0 = store.read(0, 256)
        assert mx.array_equal(k[:, :, :256], k0).item() and mx.array_equal(v[:, :, :256], v0).item()
        assert mx.allclose(k[:, :, 256:], new, atol=0.05).item()
        assert all(not a[:, :, 301:].any().item() for a in buffers)  # the tail past the write: zeros
        assert all(mx.array_equal(a, b).item() for a, b in zip(checkpoint, before))


def test_head_dim_not_a_multiple_of_the_group_is_an_error():
    with pytest.raises(ValueError, match="group size"):
        QuantizedKVStore().write(0, mx.zeros((1, 1, 4, 48)), mx.zeros((1, 1, 4, 48)))


def test_8bit_slices_go_through_our_dequantize_kernel_where_it_applies(monkeypatch):
    # The kernel is CUDA's (equal to MLX's dequantize bit for bit, checked per process on the device):
    # a stand-in that dequantizes the slices it is given, by MLX, takes its place here, so what is
    # tested is the plumbing: a window of rows of several heads handed over as it lies in the buffers.
    from engine import cuda_dequant

    given = []

    def stand_in(packed, scales, biases, *, bits, group_size):
        given.append((packed.shape, scales.shape))
        return mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits).astype(scales.dtype)

    x = mx.random.normal((1, 3, 300, 128), key=mx.random.key(4)).astype(mx.bfloat16)
    store = QuantizedKVStore()
    store.write(0, x, 2 * x)
    expected = store.read(37, 291)
    monkeypatch.setattr(cuda_dequant, "_rows_apply", lambda *_: True)
    monkeypatch.setattr(cuda_dequant, "dequantize_rows", stand_in)
    got = store.read(37, 291)
    assert given == [((1, 3, 254, 32), (1, 3, 254, 2))] * 2  # keys and values, each the slice itself
    for ours, theirs in zip(got, expected):
        assert ours.shape == theirs.shape == (1, 3, 254, 128) and ours.dtype == mx.bfloat16
        assert mx.array_equal(ours, theirs).item()
