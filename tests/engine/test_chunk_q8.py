"""A short chunk over an 8-bit window cache's dense rows attends through `engine.cuda_chunk_attention`'s 8-bit
kernel, reading the rows where they lie. On the CPU the kernel is a stand-in (`semantic_kernels`, conftest.py:
real causal attention over the rows it is handed, dequantized, zeros if launched with another count): the
window cache hands the rows out as they lie only while the kernel is asked for, the logits are those of the
path without it, and the forwards it does not take (one row, more than `CHUNK_MAX_ROWS`) keep their paths."""
from __future__ import annotations

import mlx.core as mx

from engine import decode_kernels
from engine.decode_choice import DecodeKernels
from engine.decode_kernels import CHUNK_MAX_ROWS, Q8Chunk
from engine.window import WindowPolicy, make_window_cache

POLICY = WindowPolicy(True, 16, 16, 8, 0, "block")
OURS = DecodeKernels(attention_chunk_q8=True, source="setting")


def tokens(n: int) -> mx.array:
    return (mx.arange(n) * 7 % 89 + 5).astype(mx.uint32)[None]


def prefilled(model, n: int, seed: int = 3) -> list:
    cache = make_window_cache(model, POLICY, kv_bits=8)
    for c in cache:
        c.dense_from = 0  # every row dense: the chunk attends the whole history
    model((mx.arange(n) * seed % 97 + 3).astype(mx.uint32)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def test_a_short_chunk_over_8bit_rows_takes_the_kernel_and_gives_the_paths_logits(tiny_loaded, semantic_kernels):
    """The kernel reads its queries as bf16 (the stand-in too): logits (about 15 at most) within 0.5 of the
    float32 path's, where a chunk that attended another history moves them by 18-24 (the last assertion)."""
    model = tiny_loaded.model
    plain, ours, other = prefilled(model, 100), prefilled(model, 100), prefilled(model, 100, seed=5)
    for rows in (2, 5, CHUNK_MAX_ROWS):
        expected = model(tokens(rows), cache=plain)
        before = len(semantic_kernels)
        with OURS.scope(rows=rows):
            got = model(tokens(rows), cache=ours)
        assert semantic_kernels[before:] == ["chunk_q8"] * len(model.layers)
        assert mx.abs(got - expected).max().item() < 0.5
        assert mx.abs(model(tokens(rows), cache=other) - expected).max().item() > 5.0
    assert ours[0].offset == plain[0].offset == 100 + 2 + 5 + CHUNK_MAX_ROWS


def test_one_row_and_longer_chunks_keep_their_paths(tiny_loaded, semantic_kernels):
    model = tiny_loaded.model
    plain, ours = prefilled(model, 60), prefilled(model, 60)
    for rows in (1, CHUNK_MAX_ROWS + 1):
        expected = model(tokens(rows), cache=plain)
        with OURS.scope(rows=rows):
            got = model(tokens(rows), cache=ours)
        assert mx.abs(got - expected).max().item() < 1e-5
    assert "chunk_q8" not in semantic_kernels


def test_the_window_cache_hands_out_8bit_rows_only_while_the_kernel_is_asked_for(tiny_loaded, semantic_kernels):
    model = tiny_loaded.model
    cache = prefilled(model, 40)[0]
    rows = mx.zeros((1, cache.store.keys[0].shape[1], 40, 64))  # past the direct limit of mlx-lm's 8-bit attention
    with OURS.scope(rows=40):
        keys, _ = cache.update_and_fetch(rows, rows)
    assert isinstance(keys, Q8Chunk) and keys[0].shape[2] == 80 and cache.bits == 8
    keys, _ = cache.update_and_fetch(rows, rows)
    assert isinstance(keys, mx.array) and keys.shape[2] == 120  # dequantized, as without the kernel


def test_other_8bit_rows_keep_mlx_lms_quantized_attention_while_the_kernel_is_asked_for(
        tiny_loaded, semantic_kernels, monkeypatch):
    """A traced verify step's buffers (masked) reach mlx-lm's quantized attention as plain triples: they keep its
    call, not the chunk kernel nor the dequantized fallback kept for the rows handed out for the kernel."""
    from mlx_lm.models import base

    from engine import cuda_attention

    monkeypatch.setattr(cuda_attention, "reference", lambda *a, **k: (_ for _ in ()).throw(AssertionError("fallback")))
    rows = mx.random.normal((1, 2, 300, 64), key=mx.random.key(4))
    triple = tuple(mx.quantize(rows, group_size=64, bits=8))
    queries = lambda: mx.random.normal((1, 4, 5, 64), key=mx.random.key(5))  # noqa: E731 - mlx-lm scales them in place
    decode_kernels.install()
    expected = decode_kernels._installed[0](queries(), triple, triple, 0.125, "causal", 64, 8)
    with OURS.scope(rows=5):
        got = base.quantized_scaled_dot_product_attention(queries(), triple, triple, 0.125, "causal", 64, 8)
    assert mx.allclose(got, expected).item() and "chunk_q8" not in semantic_kernels
