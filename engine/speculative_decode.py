"""Speculative decoding as the engine's decode loop: pick a mode, yield tokens.

`speculative_decode` has the shape of `engine.generate.decode` (same cache
precondition, same EOS and cancel behaviour) and adds the speculation mode;
the engine calls one or the other.
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Iterator, Sequence

import mlx.core as mx

from engine import qkv
from engine.compute import ComputePath, path_of
from engine.errors import RequestCancelled
from engine.generate import keep_room
from engine.lookup import PromptLookupDrafter
from engine.request import Metrics, SamplingParams
from engine.sampling import RepetitionPenalty, Sampler
from engine.speculative import (
    DEFAULT_COST_PER_TOKEN,
    BreakEvenGuard,
    Cache,
    Drafter,
    Mode,
    SpeculativeDecoder,
)

# A draft model's forward costs about as much as the target's on this CPU
# (per-op overhead dominates small models), so auto charges it in full.
DRAFT_MODEL_COST = 1.0


def make_decoder(
    mode: Mode | str,
    model: Any,
    cache: list[Cache],
    history: Sequence[int],
    sampling: SamplingParams = SamplingParams(),
    draft: Drafter | None = None,
    should_stop: Any = None,
    forward: Any = None,
    cost_per_token: float = DEFAULT_COST_PER_TOKEN,
    penalty: RepetitionPenalty | None = None,
) -> SpeculativeDecoder:
    """Build the decoder for a speculation mode.

    Args:
        mode: `off`, `lookup` (prompt lookup), `draft` (needs `draft`), or
            `auto` (the draft model if given, else prompt lookup, paused while
            below break-even).
        model: The target model.
        cache: The target's cache, holding all of `history` but the last token.
        history: Prompt and output so far.
        sampling: Greedy when temperature == 0.
        draft: A draft-model drafter (`engine.draft_model.DraftModelDrafter`).
        should_stop: Cancellation poll (see `SpeculativeDecoder`).
        forward: The target call (see `SpeculativeDecoder`).
        cost_per_token: Break-even input for `auto`.
        penalty: The request's repetition penalty (see `SpeculativeDecoder`).

    Raises:
        ValueError: Unknown mode, or `draft` mode without a draft model.
    """
    try:
        mode = Mode(mode)
    except ValueError as err:
        raise ValueError(
            f"speculation mode must be one of {[m.value for m in Mode]}, got {mode!r}"
        ) from err
    drafter: Drafter | None = None
    guard = None
    if mode is Mode.LOOKUP:
        drafter = PromptLookupDrafter()
    elif mode is Mode.DRAFT:
        if draft is None:
            raise ValueError("speculation mode 'draft' needs a draft model")
        drafter = draft
    elif mode is Mode.AUTO:
        drafter = draft or PromptLookupDrafter()
        guard = BreakEvenGuard(cost_per_token, draft_cost=0.0 if draft is None else DRAFT_MODEL_COST)
    return SpeculativeDecoder(model, cache, history, drafter, sampling, guard, should_stop, forward, penalty)


def speculative_decode(
    compute: ComputePath | Any,
    cache: list[Any],
    logits: mx.array,
    sampler: Sampler,
    max_tokens: int,
    eos_token_ids: Collection[int] = (),
    should_cancel: Any = None,
    *,
    prompt_ids: Sequence[int],
    mode: Mode | str = Mode.LOOKUP,
    sampling: SamplingParams = SamplingParams(),
    draft: Drafter | None = None,
    metrics: Metrics | None = None,
    penalty: RepetitionPenalty | None = None,
    room: qkv.Room = qkv.Room(),
) -> Iterator[int]:
    """Like `engine.generate.decode`, with speculative rounds after the first token.

    The first token comes from the prefill's logits through `sampler`; later
    tokens come from `SpeculativeDecoder` rounds. The EOS token is not
    yielded; it ends the loop (tokens a round accepted after it are dropped).

    Args:
        compute, cache, logits, sampler, max_tokens, eos_token_ids, should_cancel, room:
            As for `engine.generate.decode` (the cache holds the whole prompt); a round verifies through
            `ComputePath.verify` (`_verifier`).
        prompt_ids: The prompt (drafts are looked up in it).
        mode: Speculation mode (see `make_decoder`).
        sampling: The request's sampling parameters.
        draft: A draft-model drafter for modes `draft` and `auto`.
        metrics: Receives drafted and accepted token counts as rounds finish.
        penalty: The request's repetition penalty (first token and every round).

    Yields:
        Token ids.

    Raises:
        RequestCancelled: When `should_cancel` returned True (a round in flight is rolled back first).
    """
    stop = should_cancel or (lambda: False)
    if max_tokens <= 0:
        return
    if stop():
        raise RequestCancelled("cancelled during decode at token 0")
    first = _first_token(sampler, logits, penalty)
    if first in eos_token_ids:
        return
    yield first
    path = path_of(compute)
    decoder = make_decoder(mode, path.model, cache, list(prompt_ids) + [first], sampling, draft, stop,
                           forward=_verifier(path, cache, room), penalty=penalty)
    produced = 1
    while produced < max_tokens:
        for token in _round(decoder, max_tokens - produced, metrics):
            if token in eos_token_ids:
                return
            produced += 1
            yield token


def _verifier(path: ComputePath, cache: list[Any], room: qkv.Room) -> Callable[[mx.array], mx.array]:
    """A round's target call: `path.verify` over `cache`, after making room for its rows where they would pass the
    buffers (`engine.generate.keep_room`)."""
    def verify(ids: mx.array) -> mx.array:
        keep_room(cache, ids.shape[-1], room)
        return path.verify(ids, cache)
    return verify


def _first_token(sampler: Sampler, logits: mx.array, penalty: RepetitionPenalty | None) -> int:
    """The first token from the prefill's logits, through the penalty (which then holds it)."""
    if penalty is None:
        return int(sampler(logits).item())
    first = int(sampler(penalty.apply(logits)).item())
    penalty.observe((first,))
    return first


def _round(decoder: SpeculativeDecoder, limit: int, metrics: Metrics | None) -> list[int]:
    """One decoder round's tokens; its drafted and accepted counts go to `metrics`."""
    drafted, accepted = decoder.stats.drafted, decoder.stats.accepted
    tokens = decoder.step(limit=limit)
    if metrics is not None:
        metrics.drafted_tokens += decoder.stats.drafted - drafted
        metrics.accepted_tokens += decoder.stats.accepted - accepted
    return tokens
