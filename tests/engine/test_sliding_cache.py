"""Sliding-window layers (Gemma 3's local layers) through the engine's position-addressed cache."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_models import write_gguf

from engine.engine import Engine
from engine.loading import load_model
from engine.request import Request
from engine.window import SlidingKVCache, WindowPolicy, make_window_cache


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    tiny = write_gguf(tmp_path_factory.mktemp("sliding") / "gemma3.gguf", "gemma3", Q.F32)
    return load_model(str(tiny.path), progress=False, gguf_bits=32)


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_chunked_prefill_and_decode_match_the_whole_sequence(gemma, kv_bits):
    model = gemma.model
    ids = mx.array(np.random.default_rng(0).integers(0, gemma.config["vocab_size"], (1, 23)))
    expected = model(ids)  # no cache: mlx-lm's own sliding-window mask over the whole sequence
    caches = make_window_cache(model, WindowPolicy(enabled=False), kv_bits)
    sliding = [c for c in caches if isinstance(c, SlidingKVCache)]
    assert sliding and all(c.size == gemma.config["sliding_window"] for c in sliding)
    pieces = [model(ids[:, a:b], cache=caches) for a, b in ((0, 7), (7, 9), (9, 20))]
    pieces += [model(ids[:, i:i + 1], cache=caches) for i in range(20, 23)]  # decode steps
    got = mx.concatenate(pieces, axis=1)
    tolerance = 1e-4 if kv_bits == 16 else 0.05  # 8-bit keys and values
    assert (mx.abs(got - expected).max() / mx.abs(expected).max()).item() < tolerance
    assert all(c.offset == 23 for c in caches)


def test_the_engine_restores_a_gemma_prefix_it_has_seen(gemma):
    engine = Engine(gemma, prefill_chunk=8)
    try:
        prompt = list(range(5, 60))
        first = engine.submit(Request(prompt_ids=prompt, max_tokens=6)).result()
        second = engine.submit(Request(prompt_ids=prompt + [61, 62], max_tokens=6)).result()
    finally:
        engine.close()
    assert first.error is None and second.error is None
    assert second.metrics.cached_tokens >= len(prompt) - 8  # the prefix was restored, not recomputed
    fresh = Engine(gemma, prefill_chunk=8)
    try:
        again = fresh.submit(Request(prompt_ids=prompt + [61, 62], max_tokens=6)).result()
    finally:
        fresh.close()
    assert again.text == second.text  # restoring gives what computing afresh gives
