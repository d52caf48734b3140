"""Speculative decoding: draft k tokens cheaply, verify them in one target forward.

Each round feeds [last token, d1 .. dk] to the target model in ONE forward,
keeps the longest draft prefix the target agrees with, and adds the target's
own next token, so a round emits 1 .. k+1 tokens. Rejected drafts are rolled
back: KV layers by `trim`, layers that cannot be trimmed (the recurrent state
of hybrid models, `ArraysCache`) by restoring a snapshot taken before the
round and re-running the accepted tokens.

Exactness:
- Greedy (temperature 0): a draft is kept only when it equals the target's
  argmax at its position, so the output is the plain greedy output.
- Temperature > 0: drafts are deterministic functions of the history (prompt
  lookup, a greedy draft model), so draft token t at a position is kept with
  probability p(t) and otherwise the token is drawn from p with t removed,
  renormalized. Each emitted token is then distributed exactly as p.

A round either completes or leaves no trace: on cancellation (`should_stop`)
or any exception the cache goes back to where the round started.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Protocol, Sequence

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map

from engine.errors import RequestCancelled
from engine.request import SamplingParams
from engine.sampling import RepetitionPenalty

log = logging.getLogger(__name__)

# Extra cost of each additional verified token, in units of a one-token target
# forward: (CPU-time ratio - 1) / (n - 1) measured on the default model at
# context 512 was 0.32 / 0.24 / 0.22 for n = 5 / 9 / 13 under heavy load
# (docs/benchmarks.md, "Speculative decoding").
DEFAULT_COST_PER_TOKEN = 0.25


class Mode(str, Enum):
    """How decoding drafts: not at all, from the context, with a draft model,
    or from the context while it pays off."""

    OFF = "off"
    LOOKUP = "lookup"
    DRAFT = "draft"
    AUTO = "auto"


class Drafter(Protocol):
    """Proposes tokens to follow a history; learns from how many were kept."""

    def draft(self, history: Sequence[int], k: int | None = None) -> list[int]: ...

    def observe(self, drafted: int, accepted: int) -> None: ...


class Cache(Protocol):
    """The part of mlx-lm's cache vocabulary that rollback uses."""

    offset: int
    state: Any

    def is_trimmable(self) -> bool: ...

    def trim(self, n: int) -> int: ...


@dataclass
class SpeculationStats:
    """Counters of one decoder (feed drafted/accepted into `Metrics`)."""

    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    forwards: int = 0  # target forwards, re-runs after a snapshot restore included
    rounds: int = 0
    reruns: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / self.forwards if self.forwards else 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(acceptance_rate=self.acceptance_rate, tokens_per_forward=self.tokens_per_forward)
        return d


class BreakEvenGuard:
    """Turns drafting off while it costs more than it saves (mode `auto`).

    Each drafting round emits `accepted + 1` tokens at some cost, in units of
    one plain (one-token) decode step. The cost is **measured** once a few
    plain steps have been timed: the round's wall time over the median plain
    step, each round capped at twice the larger of the model's estimate and the
    window's (low) median measured cost: a one-off trace or a burst of load does not
    count as the price of drafting, while rounds that are all dear (verifying
    several rows over 128k keys on the H200: prompt lookup 2.3 tok/s against 31
    plain, docs/benchmarks.md, *GPU engine*, fifth session, run f) count in
    full, whatever the prior said. Until then it comes from
    the cost model: `1 + (cost_per_token + draft_cost) * drafted`. Over the last
    `window` drafting rounds, if emitted / cost falls below `margin`, drafting
    pauses for `cooldown` plain steps (which also refresh the plain timing),
    then probes again with a fresh window.

    Args:
        cost_per_token: Prior extra cost of each verified token.
        draft_cost: Prior cost of drafting one token (0 for prompt lookup).
        window: Drafting rounds to judge over.
        min_rounds: Rounds before the first judgement.
        margin: Break-even ratio (1.0 = as fast as plain decoding).
        cooldown: Plain steps to decode before probing again.
        clock: Seconds for timing rounds; None judges by the cost model only.
        min_plain: Timed plain steps needed before measured costs are used.
    """

    def __init__(
        self,
        cost_per_token: float = DEFAULT_COST_PER_TOKEN,
        draft_cost: float = 0.0,
        window: int = 16,
        min_rounds: int = 4,
        margin: float = 1.0,
        cooldown: int = 64,
        clock: Callable[[], float] | None = time.perf_counter,
        min_plain: int = 3,
    ) -> None:
        self.cost_per_token = cost_per_token
        self.draft_cost = draft_cost
        self.window = window
        self.min_rounds = min_rounds
        self.margin = margin
        self.cooldown = cooldown
        self.clock = clock
        self.min_plain = min_plain
        self._rounds: list[tuple[int, float, float | None]] = []  # emitted, model cost, seconds
        self._plain: deque[float] = deque(maxlen=32)
        self._started: float | None = None
        self._paused_for = 0
        self.pauses = 0
        self.last_ratio: float | None = None

    @property
    def active(self) -> bool:
        return self._paused_for == 0

    @property
    def plain_step_s(self) -> float | None:
        """Median seconds of a plain step, once `min_plain` were timed."""
        if len(self._plain) < self.min_plain:
            return None
        return statistics.median(self._plain)

    def begin_round(self) -> None:
        """Start timing a round (call before drafting)."""
        self._started = self.clock() if self.clock is not None else None

    def record(self, drafted: int, accepted: int) -> None:
        """Account for one round (drafted == 0 means a plain step)."""
        seconds = None
        if self._started is not None:
            seconds, self._started = self.clock() - self._started, None
        if drafted == 0:
            if seconds is not None:
                self._plain.append(seconds)
            if not self.active:
                self._paused_for -= 1
            return
        model_cost = 1.0 + (self.cost_per_token + self.draft_cost) * drafted
        self._rounds = (self._rounds + [(accepted + 1, model_cost, seconds)])[-self.window :]
        if len(self._rounds) < self.min_rounds:
            return
        ratio = sum(e for e, _, _ in self._rounds) / sum(self._costs())
        self.last_ratio = ratio
        if ratio < self.margin:
            log.info("speculation paused: %.2f tokens per plain-step cost < %.2f", ratio, self.margin)
            self._paused_for, self._rounds = self.cooldown, []
            self.pauses += 1

    def _costs(self) -> list[float]:
        plain = self.plain_step_s
        if plain is None or plain <= 0 or any(s is None for _, _, s in self._rounds):
            return [c for _, c, _ in self._rounds]
        measured = [s / plain for _, _, s in self._rounds]
        typical = statistics.median_low(measured)  # of an even count, the lower: two spikes in four stay spikes
        return [min(m, 2.0 * max(c, typical)) for m, (_, c, _) in zip(measured, self._rounds)]


def target_probs(logits: mx.array, sampling: SamplingParams) -> np.ndarray:
    """The distribution tokens are drawn from: softmax(logits / T), top-p filtered.

    Args:
        logits: [L, V] target logits.
        sampling: Temperature (> 0) and top-p.

    Returns:
        [L, V] float64 probabilities, each row summing to 1.
    """
    z = np.asarray(logits.astype(mx.float32), dtype=np.float64) / sampling.temperature
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        # Keep the smallest head whose mass reaches top_p (always the top token).
        keep_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) < sampling.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def residual(p: np.ndarray, rejected: int) -> np.ndarray:
    """p with the rejected deterministic draft removed, renormalized."""
    r = p.copy()
    r[rejected] = 0.0
    return r / r.sum()


def verify_sampled(
    probs: np.ndarray, drafts: Sequence[int], rng: np.random.Generator
) -> tuple[int, int]:
    """Rejection-sample deterministic drafts against the target distribution.

    Args:
        probs: [len(drafts) + 1, V] target probabilities per position.
        drafts: The drafted tokens.
        rng: Random source.

    Returns:
        (accepted, next_token): how many drafts were kept, and the token that
        follows them (a residual draw at the first rejection, else a draw from
        the last row).
    """
    for i, d in enumerate(drafts):
        if rng.random() < probs[i, d]:
            continue
        return i, int(rng.choice(probs.shape[1], p=residual(probs[i], d)))
    last = probs[len(drafts)]
    return len(drafts), int(rng.choice(last.shape[0], p=last))


def verify_greedy(logits: mx.array, drafts: Sequence[int]) -> tuple[int, int]:
    """Keep drafts while they equal the target's argmax; return (accepted, next)."""
    best = mx.argmax(logits, axis=-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == best[n]:
        n += 1
    return n, best[n]


class SpeculativeDecoder:
    """Decodes a request round by round, speculating when it has a drafter.

    The cache must hold every token of `history` except the last one (the
    usual state after prefilling a prompt, or after sampling the first token).

    Args:
        model: The target mlx-lm model.
        cache: The target's per-layer cache (mutated in place).
        history: Prompt tokens and any output so far; extended by `step`.
        drafter: Source of drafts; None decodes one token per forward.
        sampling: Greedy when temperature == 0.
        guard: Pauses drafting below break-even (mode `auto`); None never pauses.
        should_stop: Polled after drafting and after verification; True
            cancels the round (rolled back) with `RequestCancelled`.
        forward: The target call, `forward(ids[1, L]) -> logits[1, L, V]`;
            `model(ids, cache=cache)` when None.
        penalty: The request's repetition penalty, holding the output before
            `history[-1]` inclusive; verification applies it per row.
    """

    def __init__(
        self,
        model: Any,
        cache: list[Cache],
        history: Sequence[int],
        drafter: Drafter | None = None,
        sampling: SamplingParams = SamplingParams(),
        guard: BreakEvenGuard | None = None,
        should_stop: Callable[[], bool] | None = None,
        forward: Callable[[mx.array], mx.array] | None = None,
        penalty: RepetitionPenalty | None = None,
    ) -> None:
        if not history:
            raise ValueError("history needs at least one token (the last prompt token)")
        self.cache = cache
        self.history = [int(t) for t in history]
        self.drafter = drafter
        self.sampling = sampling
        self.guard = guard
        self.should_stop = should_stop or (lambda: False)
        self._forward = forward or (lambda ids: model(ids, cache=cache))
        self._rng = np.random.default_rng(sampling.seed)
        self._needs_snapshot = any(not c.is_trimmable() for c in cache)
        self.stats = SpeculationStats()
        self.penalty = penalty

    def step(self, limit: int | None = None) -> list[int]:
        """Run one round and return the 1 .. k+1 tokens it emitted.

        Args:
            limit: Emit at most this many tokens (the request's remaining
                budget); drafts are capped to limit - 1.

        Raises:
            RequestCancelled: `should_stop` fired; the cache is as before the round.
        """
        if limit is not None and limit <= 0:
            return []
        if self.guard is not None:
            self.guard.begin_round()
        drafts = self._draft(limit)
        if self.should_stop():
            raise RequestCancelled("cancelled before verification")
        inputs = [self.history[-1]] + drafts
        offsets = [c.offset if c.is_trimmable() else 0 for c in self.cache]
        snapshot = self._snapshot() if self._needs_snapshot else None
        try:
            logits = self._forward(mx.array([inputs], dtype=mx.uint32))[0]
            self.stats.forwards += 1
            if self.penalty is not None:
                logits = self.penalty.apply_rows(logits, drafts)
            if self.sampling.temperature == 0:
                accepted, nxt = verify_greedy(logits, drafts)
            else:
                accepted, nxt = verify_sampled(target_probs(logits, self.sampling), drafts, self._rng)
            if self.should_stop():
                raise RequestCancelled("cancelled during verification")
            if accepted < len(drafts):
                self._rewind(offsets, snapshot, keep=inputs[: accepted + 1])
        except BaseException:
            self._rewind(offsets, snapshot, keep=[])
            raise
        emitted = drafts[:accepted] + [nxt]
        self.history.extend(emitted)
        if self.penalty is not None:
            self.penalty.observe(emitted)
        self._account(len(drafts), accepted, len(emitted))
        return emitted

    def _draft(self, limit: int | None) -> list[int]:
        if self.drafter is None or (self.guard is not None and not self.guard.active):
            return []
        if limit == 1:
            return []
        drafts = self.drafter.draft(self.history)
        return drafts if limit is None else drafts[: limit - 1]

    def _account(self, drafted: int, accepted: int, emitted: int) -> None:
        s = self.stats
        s.rounds += 1
        s.drafted += drafted
        s.accepted += accepted
        s.emitted += emitted
        if self.drafter is not None and drafted:
            self.drafter.observe(drafted, accepted)
        if self.guard is not None:
            self.guard.record(drafted, accepted)

    def _snapshot(self) -> list[Any]:
        # Copies containers, shares the (immutable) arrays: recurrent caches
        # replace their state arrays on update rather than writing into them.
        return [None if c.is_trimmable() else tree_map(lambda x: x, c.state) for c in self.cache]

    def _rewind(self, offsets: list[int], snapshot: list[Any] | None, keep: list[int]) -> None:
        """Put the cache back to `offsets`, then re-feed `keep` if it was restored."""
        if snapshot is None and keep:
            # Every layer trims: drop only what follows the kept tokens.
            for c, start in zip(self.cache, offsets):
                c.trim(c.offset - start - len(keep))
            return
        for c, start, saved in zip(self.cache, offsets, snapshot or [None] * len(self.cache)):
            if saved is None:
                c.trim(c.offset - start)
            else:
                c.state = saved
        if keep:
            self._forward(mx.array([keep], dtype=mx.uint32))
            mx.eval([c.state for c in self.cache])
            self.stats.forwards += 1
            self.stats.reruns += 1

