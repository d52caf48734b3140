"""The loop guard and the repetition penalty in the engine, on a tiny random model that loops under
greedy decoding: the guard stops exactly where the rule says over the tokens' keys, at the same token
plain and speculative, warm and cold; off, the same request runs to max_tokens; a penalty of 1.0
changes nothing and more changes a looping output (the same with and without speculation)."""
from __future__ import annotations

import mlx.core as mx
import pytest

from engine.engine import Engine
from engine.loading import load_model
from engine.loop_guard import LoopRule
from engine.request import Request, SamplingParams, TokenEvent
from engine.sampling import RepetitionPenalty

from test_loop_guard import keyed_fire_index
from tiny_models import build_tiny_model

PROMPTS = ("def greet(name):", "hello world", "The quick brown fox", "import json\n", "Grüße aus Köln")
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def looping(tmp_path_factory):
    """A tiny llama at weight scale 1.0: greedy decoding falls into one-token runs."""
    return load_model(str(build_tiny_model(tmp_path_factory.mktemp("looping"), weight_scale=1.0)), progress=False)


@pytest.fixture(scope="module")
def engines(looping):
    """One engine per speculation mode, on the looping model."""
    made = {mode: Engine(looping, prefill_chunk=16, speculation=mode) for mode in ("off", "lookup", "auto")}
    yield made
    for engine in made.values():
        engine.close()


def run(engine: Engine, prompt: str, max_tokens: int = MAX_TOKENS, **sampling) -> tuple[list[int], str, object]:
    """(tokens, streamed text, DoneEvent) of one request."""
    handle = engine.submit(Request(prompt_ids=engine.tokenizer.encode(prompt), max_tokens=max_tokens,
                                   sampling=SamplingParams(**sampling)))
    tokens, text = [], ""
    for event in handle:
        if isinstance(event, TokenEvent):
            tokens += event.token_ids
            text += event.text
    done = handle.result()
    assert done.text == text  # the DoneEvent holds exactly what was streamed
    return tokens, text, done


def test_the_guard_stops_where_the_rule_says_and_off_runs_to_max_tokens(engines):
    fired = 0
    for prompt in PROMPTS:
        full, full_text, free = run(engines["off"], prompt)
        assert free.finish_reason == "length" and len(full) == MAX_TOKENS
        stop_at = keyed_fire_index(full, engines["off"].tokenizer.loop_keys)
        tokens, text, done = run(engines["off"], prompt, loop_guard=True)
        if stop_at is None:
            assert done.finish_reason == "length" and tokens == full
            continue
        fired += 1
        assert done.finish_reason == "repetition", prompt
        assert tokens == full[: stop_at + 1] and done.metrics.decode_tokens == stop_at + 1 < MAX_TOKENS
        assert done.metrics.loop_period == 1 and done.metrics.loop_tokens == LoopRule().min_tokens
        assert full_text.startswith(text) and len(text) > 0  # the repeated text stays, nothing rewritten
    assert fired >= 3
    # The engine still answers a normal request afterwards.
    assert run(engines["off"], PROMPTS[0], max_tokens=4)[2].finish_reason == "length"


@pytest.mark.parametrize("mode", ["lookup", "auto"])
def test_speculative_decoding_stops_at_the_same_token(engines, mode):
    accepted = 0
    for prompt in PROMPTS:
        plain, plain_text, plain_done = run(engines["off"], prompt, loop_guard=True)
        tokens, text, done = run(engines[mode], prompt, loop_guard=True)
        assert (tokens, text, done.finish_reason) == (plain, plain_text, plain_done.finish_reason), prompt
        assert done.metrics.loop_period == plain_done.metrics.loop_period
        accepted += done.metrics.accepted_tokens
    assert accepted > 0  # rounds accepted several tokens, and still stopped at the plain token


def test_warm_and_cold_stop_at_the_same_token(looping, engines):
    prompt = "def greet(name: str) -> str:\n    return f'Hello, {name}!'\n" * 3
    cold_tokens, cold_text, cold = run(engines["lookup"], prompt, loop_guard=True)
    warm_tokens, warm_text, warm = run(engines["lookup"], prompt, loop_guard=True)
    assert cold.finish_reason == "repetition" and warm.metrics.cached_tokens > 0
    assert (warm_tokens, warm_text, warm.finish_reason) == (cold_tokens, cold_text, "repetition")
    fresh = Engine(looping, prefill_chunk=16, speculation="off")
    try:
        assert run(fresh, prompt, loop_guard=True)[:2] == (cold_tokens, cold_text)
    finally:
        fresh.close()


# -- repetition penalty ---------------------------------------------------------------------

def test_the_penalty_scales_seen_logits_by_sign_and_row():
    penalty = RepetitionPenalty(2.0)
    logits = mx.array([[2.0, -2.0, 1.0, -1.0, 0.5]])
    assert penalty.apply(logits).tolist() == logits.tolist()  # nothing seen yet
    penalty.observe([0, 1])
    assert penalty.apply(logits).tolist() == [[1.0, -4.0, 1.0, -1.0, 0.5]]
    rows = penalty.apply_rows(mx.concatenate([logits] * 3), drafts=[2, 3])
    assert rows.tolist() == [[1.0, -4.0, 1.0, -1.0, 0.5],   # seen: 0, 1
                             [1.0, -4.0, 0.5, -1.0, 0.5],   # and the first draft
                             [1.0, -4.0, 0.5, -2.0, 0.5]]   # and the second
    assert RepetitionPenalty.of(SamplingParams()) is None
    assert RepetitionPenalty.of(SamplingParams(repetition_penalty=1.0)) is None
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            RepetitionPenalty(bad)


def test_a_penalty_of_one_is_mlx_lm_greedy_token_for_token(looping, engines):
    from mlx_lm.generate import generate_step

    ids = looping.tokenizer.encode(PROMPTS[1])
    tokens, _, done = run(engines["off"], PROMPTS[1], max_tokens=48, repetition_penalty=1.0)
    reference = [int(t) for t, _ in generate_step(mx.array(ids), looping.model, max_tokens=48)]
    assert tokens == reference and done.finish_reason == "length"


def test_a_penalty_changes_a_looping_output_the_same_way_with_speculation(engines):
    changed = 0
    for prompt in PROMPTS:
        plain, _, _ = run(engines["off"], prompt, max_tokens=64)
        penalized, _, _ = run(engines["off"], prompt, max_tokens=64, repetition_penalty=1.5)
        assert penalized[0] == plain[0]  # the first token has nothing to penalize
        changed += penalized != plain
        for mode in ("lookup", "auto"):
            assert run(engines[mode], prompt, max_tokens=64, repetition_penalty=1.5)[0] == penalized, (prompt, mode)
    assert changed >= 3
    # Sampled with a seed: the penalty is deterministic too.
    sampled = [run(engines["lookup"], PROMPTS[2], max_tokens=24, temperature=0.8, seed=5, repetition_penalty=1.3)[0]
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_verification_counts_the_drafts_before_each_position(looping):
    """A decoder whose drafts are always right accepts whole rounds; each verified position must see
    the drafts before it as generated, or the penalized output would drift from plain decoding."""
    from engine.generate import decode
    from engine.sampling import greedy
    from engine.speculative import SpeculativeDecoder

    from spec_helpers import ScriptedDrafter, prefill
    from spec_helpers import decode as spec_decode

    model, prompt = looping.model, looping.tokenizer.encode(PROMPTS[1])
    cache = prefill(model, prompt)
    last = model(mx.array([prompt[-1:]], dtype=mx.uint32), cache=cache)[:, -1, :]
    reference = list(decode(model, cache, last, greedy, 64, penalty=RepetitionPenalty(1.5)))
    assert len(set(reference)) > 3  # the penalty moved the output through several tokens
    penalty = RepetitionPenalty(1.5)
    penalty.observe(reference[:1])
    drafter = ScriptedDrafter(reference, len(prompt), k=6, wrong_at=99, vocab=looping.model.args.vocab_size)
    decoder = SpeculativeDecoder(model, prefill(model, prompt + reference[:1]), prompt + reference[:1], drafter,
                                 penalty=penalty)
    assert reference[:1] + spec_decode(decoder, 63) == reference
    assert decoder.stats.accepted > 30
