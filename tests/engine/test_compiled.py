"""engine.compiled: the compiled decode step equals the plain model call, step by step."""
from __future__ import annotations

import mlx.core as mx
from engine.compiled import CompiledDecodeStep
from engine.compute import ComputeOptions, choose
from engine.kv import make_cache


def _prefilled(model, n_tokens: int, kv_bits: int = 16):
    cache = make_cache(model, kv_bits=kv_bits)
    ids = (mx.arange(n_tokens) % 97 + 3).astype(mx.uint32)[None]
    mx.eval(model(ids, cache=cache), [c.state for c in cache])
    return cache


def greedy(step, cache, n_steps: int):
    """`n_steps` greedy tokens from token 5 through `step(tokens, cache)`, and each step's last logits."""
    token, tokens, logits = mx.array([[5]], dtype=mx.uint32), [], []
    for _ in range(n_steps):
        out = step(token, cache)[:, -1, :]
        token = mx.argmax(out, axis=-1)[None].astype(mx.uint32)
        tokens.append(token.item())
        logits.append(out)
    return tokens, logits


def test_compiled_steps_match_plain_steps_across_buffer_growth(tiny_loaded):
    model = tiny_loaded.model
    plain_cache, compiled_cache = _prefilled(model, 250), _prefilled(model, 250)
    step = CompiledDecodeStep(model)
    # 250 + 20 crosses the 256-row allocation boundary of KVCache.
    plain_tokens, plain_logits = greedy(lambda t, c: model(t, cache=c), plain_cache, 20)
    tokens, logits = greedy(step, compiled_cache, 20)
    assert tokens == plain_tokens
    assert max(mx.abs(a - b).max().item() for a, b in zip(plain_logits, logits)) < 1e-4
    assert step.fallbacks == 0
    assert step.traces == 2  # one trace per buffer capacity, none per step
    for a, b in zip(plain_cache, compiled_cache):
        assert a.offset == b.offset == 270
        assert mx.allclose(a.state[0], b.state[0], atol=1e-5).item()
        assert mx.allclose(a.state[1], b.state[1], atol=1e-5).item()


def test_prefill_after_compiled_decode_continues_the_same_cache(tiny_loaded):
    model = tiny_loaded.model
    plain_cache, compiled_cache = _prefilled(model, 40), _prefilled(model, 40)
    greedy(lambda t, c: model(t, cache=c), plain_cache, 3)
    greedy(CompiledDecodeStep(model), compiled_cache, 3)
    more = mx.array([[7, 8, 9, 10]], dtype=mx.uint32)
    assert mx.allclose(model(more, cache=plain_cache), model(more, cache=compiled_cache), atol=1e-4).item()


def test_quantized_caches_fall_back_to_the_plain_call(tiny_loaded):
    kv_bits = 8
    model = tiny_loaded.model
    step = CompiledDecodeStep(model)
    plain_cache, cache = _prefilled(model, 30, kv_bits), _prefilled(model, 30, kv_bits)
    expected, _ = greedy(lambda t, c: model(t, cache=c), plain_cache, 4)
    tokens, _ = greedy(step, cache, 4)
    assert tokens == expected
    assert step.fallbacks == 4 and step.traces == 0


def test_multi_token_input_falls_back(tiny_loaded):
    model = tiny_loaded.model
    step = CompiledDecodeStep(model)
    cache = _prefilled(model, 10)
    out = step(mx.array([[4, 5]], dtype=mx.uint32), cache)
    assert out.shape[1] == 2 and step.fallbacks == 1 and cache[0].offset == 12


def test_a_disabled_step_takes_the_plain_call(tiny_loaded):
    step = CompiledDecodeStep(tiny_loaded.model)
    step.enabled = False  # what a step does after its first compile failed
    greedy(step, _prefilled(tiny_loaded.model, 10), 2)
    assert step.traces == 0 and step.fallbacks == 2


def test_the_compute_path_owns_its_steps_and_compile_off_has_none(tiny_loaded):
    model = tiny_loaded.model
    path = choose(model, ComputeOptions(attention="mlx"))
    assert path.compiled and path.decode_step is not None and "compile=on" in path.identity()
    plain_tokens, _ = greedy(lambda t, c: model(t, cache=c), _prefilled(model, 40), 6)
    tokens, _ = greedy(lambda t, c: path.forward(t, c), _prefilled(model, 40), 6)
    assert tokens == plain_tokens and path.decode_step.traces == 1
    off = choose(model, ComputeOptions(attention="mlx", compile=False))
    assert off.decode_step is None and "compile=off" in off.identity()
    assert greedy(lambda t, c: off.forward(t, c), _prefilled(model, 40), 6)[0] == plain_tokens
    assert not [name for name in vars(model) if name.startswith("_codectx")]  # nothing kept on the model
