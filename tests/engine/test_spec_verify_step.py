"""The compiled multi-token verify step equals the plain model call."""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from engine.compiled import VERIFY_MAX_TOKENS, CompiledDecodeStep
from engine.compute import ComputeOptions, choose
from engine.kv import make_cache


def prefilled(model, n_tokens: int, kv_bits: int = 16):
    cache = make_cache(model, kv_bits=kv_bits)
    ids = (mx.arange(n_tokens) % 89 + 3).astype(mx.uint32)[None]
    mx.eval(model(ids, cache=cache), [c.state for c in cache])
    return cache


def test_verify_step_matches_the_plain_call_for_every_length_and_across_growth(tiny_loaded):
    model = tiny_loaded.model
    step = CompiledDecodeStep(model, max_tokens=VERIFY_MAX_TOKENS)
    # 246 cached + 2 + 3 + 5 = 256, then 9 more crosses KVCache's 256-row allocation.
    plain, compiled = prefilled(model, 246), prefilled(model, 246)
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 9, 16):
        ids = mx.array(rng.integers(3, 400, size=(1, n)), dtype=mx.uint32)
        want, got = model(ids, cache=plain), step(ids, compiled)
        assert got.shape == want.shape == (1, n, want.shape[-1])
        assert mx.abs(want - got).max().item() < 1e-4
        assert (mx.argmax(want, -1) == mx.argmax(got, -1)).all().item()
    assert step.fallbacks == 0 and step.traces == 5
    for a, b in zip(plain, compiled):
        assert a.offset == b.offset == 246 + 35
        assert mx.allclose(a.state[0], b.state[0], atol=1e-5).item()
        assert mx.allclose(a.state[1], b.state[1], atol=1e-5).item()


def test_rejected_drafts_trim_and_the_same_length_replays_without_tracing(tiny_loaded):
    model = tiny_loaded.model
    step = CompiledDecodeStep(model, max_tokens=VERIFY_MAX_TOKENS)
    plain, compiled = prefilled(model, 30), prefilled(model, 30)
    for round_ in range(3):
        ids = mx.array([[5 + round_, 6, 7, 8]], dtype=mx.uint32)
        want, got = model(ids, cache=plain), step(ids, compiled)
        assert mx.abs(want - got).max().item() < 1e-4
        for cache in (plain, compiled):  # keep 2 of the 4 tokens, as a partial acceptance does
            for c in cache:
                c.trim(2)
    assert step.traces == 1
    assert compiled[0].offset == plain[0].offset == 36
    probe = mx.array([[9]], dtype=mx.uint32)
    assert mx.allclose(model(probe, cache=plain), model(probe, cache=compiled), atol=1e-4).item()


def test_longer_inputs_and_quantized_caches_take_the_plain_call(tiny_loaded):
    model = tiny_loaded.model
    step = CompiledDecodeStep(model, max_tokens=4)
    out = step(mx.array([[3, 4, 5, 6, 7]], dtype=mx.uint32), prefilled(model, 8))
    assert out.shape[1] == 5 and step.fallbacks == 1 and step.traces == 0
    step(mx.array([[3, 4]], dtype=mx.uint32), prefilled(model, 8, kv_bits=8))
    assert step.fallbacks == 2 and step.traces == 0


def test_the_compute_path_verifies_through_its_compiled_step(tiny_loaded):
    model = tiny_loaded.model
    path = choose(model, ComputeOptions(attention="mlx"))
    plain, compiled = prefilled(model, 20), prefilled(model, 20)
    ids = mx.array([[5, 6, 7]], dtype=mx.uint32)
    assert mx.abs(model(ids, cache=plain) - path.verify(ids, compiled)).max().item() < 1e-4
    assert path._verify.max_tokens == VERIFY_MAX_TOKENS and path._verify.traces == 1
    assert choose(model, ComputeOptions(attention="mlx", compile=False))._verify is None
