"""Speculative decoding, one round at a time: a round's rollback of rejected drafts, cancellation,
failures and emit limits; auto mode's pause below break-even; the decoder's modes."""
from __future__ import annotations

import numpy as np
import pytest

from engine.draft_model import DraftModelDrafter
from engine.errors import RequestCancelled
from engine.speculative import BreakEvenGuard, Mode, SpeculativeDecoder
from engine.speculative_decode import make_decoder

from spec_helpers import ScriptedDrafter, decode, plain_greedy, prefill, prompts, tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


# ---- rollback and cancellation --------------------------------------------


def cache_matches_fresh_prefill(model, cache, history):
    fresh = prefill(model, history)
    for mine, ref in zip(cache, fresh):
        assert mine.offset == ref.offset == len(history) - 1
        for a, b in zip(mine.keys_and_values(), ref.keys_and_values()):
            np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)


@pytest.mark.parametrize("wrong_at", [0, 2, 5])
def test_partial_acceptance_trims_exactly_the_rejected_drafts(target, wrong_at):
    prompt = prompts()[4]
    reference = plain_greedy(target, prompt, 20)
    cache = prefill(target, prompt)
    drafter = ScriptedDrafter(reference, len(prompt), k=6, wrong_at=wrong_at)
    dec = SpeculativeDecoder(target, cache, prompt, drafter)
    first = dec.step()
    assert first == reference[: min(wrong_at, 6) + 1]
    assert dec.stats.accepted == min(wrong_at, 6)
    cache_matches_fresh_prefill(target, cache, dec.history)
    assert first + decode(dec, 20 - len(first)) == reference


@pytest.mark.parametrize("cancel_on_poll", [1, 2])
def test_cancel_mid_round_leaves_no_trace(target, cancel_on_poll):
    prompt = prompts()[5]
    reference = plain_greedy(target, prompt, 24)
    cache = prefill(target, prompt)
    polls = []

    def should_stop():  # poll 1: after drafting; poll 2: after verification
        polls.append(1)
        return len(polls) == cancel_on_poll

    drafter = ScriptedDrafter(reference, len(prompt), k=5, wrong_at=3)
    dec = SpeculativeDecoder(target, cache, prompt, drafter, should_stop=should_stop)
    with pytest.raises(RequestCancelled):
        dec.step()
    assert dec.history == prompt
    assert [c.offset for c in cache] == [len(prompt) - 1] * len(cache)
    assert dec.stats.emitted == 0
    # Resuming after the cancel gives the plain output.
    assert decode(dec, 24) == reference


def test_failing_forward_rolls_back_the_round(target):
    prompt = prompts()[3]
    reference = plain_greedy(target, prompt, 12)
    cache = prefill(target, prompt)
    failures = [True]

    def forward(ids):
        logits = target(ids, cache=cache)
        if failures.pop() if failures else False:
            raise RuntimeError("boom")
        return logits

    dec = SpeculativeDecoder(target, cache, prompt, ScriptedDrafter(reference, len(prompt), 4, 9),
                             forward=forward)
    with pytest.raises(RuntimeError):
        dec.step()
    assert cache[0].offset == len(prompt) - 1
    assert decode(dec, 12) == reference


def test_cancel_inside_draft_model_catch_up(target):
    prompt = prompts()[4]
    stop = [False]
    drafter = DraftModelDrafter(target, k=4, prefill_step=4, should_stop=lambda: stop[0])
    stop[0] = True
    assert drafter.draft(prompt) == []  # stopped before catching up: no drafts
    stop[0] = False
    assert drafter.draft(prompt) == plain_greedy(target, prompt, 4)


def test_step_never_emits_more_than_the_limit(target):
    prompt = prompts()[2]
    reference = plain_greedy(target, prompt, 10)
    dec = SpeculativeDecoder(target, prefill(target, prompt), prompt,
                             ScriptedDrafter(reference, len(prompt), k=8, wrong_at=99))
    assert dec.step(limit=3) == reference[:3]
    assert dec.step(limit=1) == reference[3:4]
    assert dec.step(limit=0) == []


# ---- auto mode ---------------------------------------------------------------


def test_auto_mode_pauses_below_break_even_and_keeps_output(target):
    prompt = prompts()[1]
    reference = plain_greedy(target, prompt, 60)
    drafter = ScriptedDrafter(reference, len(prompt), k=6, wrong_at=0)  # always wrong
    guard = BreakEvenGuard(cost_per_token=0.1, min_rounds=4, cooldown=20, clock=None)
    dec = SpeculativeDecoder(target, prefill(target, prompt), prompt, drafter, guard=guard)
    assert decode(dec, 60) == reference
    assert guard.pauses >= 1
    assert drafter.calls < 60 // 2  # drafting stopped for most of the request


def test_auto_mode_keeps_drafting_when_it_pays(target):
    prompt = prompts()[1]
    reference = plain_greedy(target, prompt, 60)
    drafter = ScriptedDrafter(reference, len(prompt), k=6, wrong_at=3)
    guard = BreakEvenGuard(cost_per_token=0.1, min_rounds=4, clock=None)
    dec = SpeculativeDecoder(target, prefill(target, prompt), prompt, drafter, guard=guard)
    assert decode(dec, 60) == reference
    assert guard.pauses == 0 and dec.stats.tokens_per_forward > 3


def test_make_decoder_rejects_bad_modes(target):
    with pytest.raises(ValueError, match="one of"):
        make_decoder("fast", target, prefill(target, [1, 2]), [1, 2])
    with pytest.raises(ValueError, match="draft model"):
        make_decoder(Mode.DRAFT, target, prefill(target, [1, 2]), [1, 2])
    assert make_decoder("off", target, prefill(target, [1, 2]), [1, 2]).drafter is None
