"""Background warm-up: re-prefill the invalidated part of the prefix after the user pauses.

Debounced per file: each edited file has its own timer, restarted by every
edit of that file. When a timer fires, the prefix is prefilled at BACKGROUND
priority (max_tokens=0) up to the first changed segment of a file whose timer
is still running (text about to change again is not worth computing), so
typing in one file does not hold back the warm-up of another. Interactive
requests preempt the warm-up at chunk boundaries (engine priority queue); a
new warm-up cancels a running one, whose confirmed checkpoints are kept.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Callable

from engine.request import Priority, PromptSegment

from .session import Session
from .warmth import segment_states

logger = logging.getLogger(__name__)
ALL = ""
"""Timer key of a warm-up not tied to one file (start-up, reindex)."""
PROGRESS_STEPS = 10
"""Warmth notifications per warm-up while it prefills (one per tenth)."""


class Warmup:
    """Debounced background prefill for one session.

    Args:
        session: The session whose prefix is kept warm.
        on_state: Called with `state()` while a warm-up prefills (a few times)
            and after every finished warm-up.
    """

    def __init__(self, session: Session, on_state: Callable[[dict], None] | None = None,
                 lead_in: Callable[[Session], list[PromptSegment]] | None = None) -> None:
        self.session = session
        self.on_state = on_state
        self.lead_in = lead_in
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._task: asyncio.Task | None = None
        self.runs = 0
        self.last_run: dict | None = None
        self.last_error: str | None = None

    def schedule(self, delay_s: float, path: Path | None = None) -> None:
        """(Re)starts the debounce timer of `path` (None: the whole prefix, e.g. start-up)."""
        if not self.session.settings.warmup.enabled:
            return
        key = self._key(path)
        if (timer := self._timers.pop(key, None)) is not None:
            timer.cancel()
        logger.debug("warm-up scheduled in %.2fs after %s", delay_s, key or "start-up")
        self._timers[key] = asyncio.get_running_loop().call_later(delay_s, self._fire, key)

    def _key(self, path: Path | None) -> str:
        if path is None or self.session.root is None:
            return ALL
        try:
            return path.relative_to(self.session.root).as_posix()
        except ValueError:
            return str(path)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = asyncio.ensure_future(self._run())

    def settled(self, prefix: list[PromptSegment]) -> list[PromptSegment]:
        """The prefix up to the first not-yet-warm segment of a file still being edited."""
        warm = self.session.backend.probe(prefix).warm_segments
        editing = set(self._timers) - {ALL}
        cut = next((i for i in range(warm, len(prefix)) if prefix[i].key in editing), len(prefix))
        return prefix[:cut]

    async def _with_lead_in(self, prefix: list[PromptSegment], settled: list[PromptSegment]) -> list[PromptSegment]:
        """`settled` plus the hover lead-in's turn and header when the whole prefix is settled
        and the backend does not hold the whole lead-in yet."""
        if self.lead_in is None or len(settled) != len(prefix):
            return settled
        lead = await self.session.prompt.call(self.lead_in, self.session)  # builds a prompt: off the loop
        if [s.token_ids for s in lead[:len(prefix)]] != [s.token_ids for s in prefix]:
            return settled
        return settled if self.session.backend.probe(lead).warm else lead

    async def _run(self) -> None:
        # Applying the edits may fold the hot tail (seconds on a large repository): on the prompt's thread.
        prefix = await self.session.prompt.call(self.session.prompt.prefix_segments)
        settled = self.settled(prefix)
        total = sum(len(s.token_ids) for s in settled)
        segments = await self._with_lead_in(prefix, settled)
        if not settled or (self.session.warm_tokens(settled) == total and segments is settled):
            if self.on_state is not None:  # nothing to prefill: say so
                self.on_state(self.state())
            return
        started = time.perf_counter()
        reported = -1

        def on_prefill(done: int, all_tokens: int) -> None:
            nonlocal reported
            step = PROGRESS_STEPS * done // max(all_tokens, 1)
            if step != reported and step < PROGRESS_STEPS and self.on_state is not None:
                reported = step
                self.on_state(dict(self.state(), prefilled=done))

        try:
            done = await self.session.generate(segments, max_tokens=0, priority=Priority.BACKGROUND,
                                               on_prefill=on_prefill)
        except asyncio.CancelledError:
            return
        except Exception as err:  # noqa: BLE001 - warm-up failures are reported in status only
            self.last_error = str(err)
            logger.warning("warm-up failed: %s", err)
            return
        if done.finish_reason == "cancelled":
            return
        self.runs += 1
        self.session.counters.warmups += 1
        self.last_run = {"tokens": total,
                         "leadInTokens": sum(len(s.token_ids) for s in segments[len(settled):]),
                         "cachedTokens": done.metrics.cached_tokens,
                         "recomputedTokens": done.metrics.recomputed_tokens,
                         "missReason": done.metrics.miss_reason,
                         "seconds": round(time.perf_counter() - started, 4)}
        if self.on_state is not None:
            self.on_state(self.state())

    @property
    def busy(self) -> bool:
        """A warm-up runs or waits for its timer."""
        return self.running or bool(self._timers)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def state(self) -> dict:
        """How warm the prefix is, for `codectx.status` and `codectx/warmth` (the prefix as last built: edits
        not applied yet are not in it)."""
        prefix = self.session.prompt.current_prefix()
        tokens = sum(len(s.token_ids) for s in prefix)
        warm = self.session.warm_tokens(prefix)
        return {"warm": bool(prefix) and warm == tokens, "warmTokens": warm, "prefixTokens": tokens,
                "warmFraction": round(warm / tokens, 4) if tokens else 0.0,
                "running": self.running, "pending": bool(self._timers),
                "pendingFiles": sorted(k for k in self._timers if k != ALL),
                "runs": self.runs, "lastRun": self.last_run, "lastError": self.last_error}

    def segment_states(self, prefix: list[PromptSegment] | None = None) -> list[str]:
        """Cache state per segment of `prefix` ("cached", "partial", "cold"), for `codectx.showContext`; default: the
        prefix as last built."""
        prefix = self.session.prompt.current_prefix() if prefix is None else prefix
        return segment_states(prefix, self.session.warm_tokens(prefix))

    def stop(self) -> None:
        """Cancels the timers and any running warm-up (shutdown)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._task is not None:
            self._task.cancel()
