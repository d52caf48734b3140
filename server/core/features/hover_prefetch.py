"""Hover answers prepared in the background, for the definitions where the user works.

Once warm-up has nothing pending, the server works on the definitions nearest
to the *focus* (the line last opened, hovered or edited) in that file, nearest
first, in two tiers:

1. answer heads (`hover.prefetchHeads`): it prefills the hover lead-in plus
   "`` `name` ``" of up to `MAX_STARTS` definitions (one short forward call
   each, no decoding) whose head the engine does not hold yet (`Backend.probe`),
   so a hover on one of them restores that checkpoint and computes one token
   before its first generated one (`hover.hover_segments`);
2. answers: it generates the explanations of the `hover.prefetch` nearest and
   puts them in the hover cache: a later hover on one of them is answered at
   once. A prepared answer is exactly what the hover would have generated
   (same prompt, same greedy decoding).

Every request is PREPARE priority (`engine.request.Priority`), so the engine
orders it after interactive work and warm-up: an interactive request or a
warm-up that arrives meanwhile goes first (a preparation in prefill resumes
after it; one that was decoding ends "cancelled" and is generated again).
Like warm-up, it is background work: off when `warmup.enabled` is false.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Callable

from engine.request import Priority, PromptSegment

from ..session import Session
from . import hover
from .symbols import DefinitionSite, site_of

logger = logging.getLogger(__name__)
MAX_STARTS = 32
"""Answer heads prefilled per focus (the nearest definitions of the focused file)."""


class HoverPrefetch:
    """Background preparation of hover answers for one session.

    Args:
        session: The session.
        cache: The hover cache answers go to.
        busy: True while warm-up has work to do or waits for its debounce (preparation
            starts once it has none: its prompts build on the prefix warm-up keeps).
        on_prepared: Called after each prepared answer or answer head.
    """

    def __init__(self, session: Session, cache: hover.HoverCache, busy: Callable[[], bool],
                 on_prepared: Callable[[], None] | None = None) -> None:
        self.session = session
        self.cache = cache
        self.busy = busy
        self.on_prepared = on_prepared
        self.focus: tuple[Path, int] | None = None
        self.prepared = 0
        self.starts = 0
        self.interrupted = 0
        self._loop_task: asyncio.Task | None = None

    @property
    def limit(self) -> int:
        return self.session.settings.hover.prefetch

    def focus_on(self, path: Path, line: int) -> None:
        """Prepare around `path`:`line` (1-based) from now on."""
        self.focus = (path, line)
        self.kick()

    def kick(self) -> None:
        """Start a pass over the focus's definitions unless one runs or there is nothing to do."""
        if self.running:
            return
        settings = self.session.settings
        if (self.limit <= 0 and not settings.hover.prefetch_heads) or not settings.warmup.enabled or self.focus is None:
            return
        self._loop_task = asyncio.ensure_future(self._run())

    @property
    def running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    def state(self) -> dict:
        return {"prepared": self.prepared, "startsPrepared": self.starts, "interrupted": self.interrupted,
                "running": self.running}

    async def _run(self) -> None:
        """One pass: each head looked at once, then the answers; until warm-up has work."""
        looked_at: set[tuple[int, ...]] = set()  # heads of this pass (an evicted one is not redone in a loop)
        while not self.busy():
            step = self._next_step(looked_at)
            if step is None:
                return
            job, done = step
            try:
                result = await job
            except asyncio.CancelledError:
                if not job.cancelled() or asyncio.current_task().cancelling():
                    raise  # this pass itself was stopped
                self.interrupted += 1  # the engine let more urgent work go first: try again
                continue
            except Exception as err:  # noqa: BLE001 - a failed preparation only costs the cache entry
                logger.warning("hover preparation failed: %s", err)
                return
            done(result)

    def _next_step(self, looked_at: set[tuple[int, ...]]):
        """(task, what to do with its result) for the next head or answer, or None."""
        head = self._next_head(looked_at)
        if head is not None:
            return self._prefill_head(head), self._prepared_head
        site = self._next_site()
        if site is None:
            return None
        key = self.cache.key(site, self.session.prompt.files)
        return hover.start(self.session, self.cache, site, key, time.perf_counter(), Priority.PREPARE), \
            self._prepared_answer

    def _prefill_head(self, segments: list[PromptSegment]) -> asyncio.Task:
        async def prefill() -> None:
            done = await self.session.generate(segments, max_tokens=0, priority=Priority.PREPARE)
            if done.finish_reason == "cancelled":
                raise asyncio.CancelledError()
        return asyncio.ensure_future(prefill())

    def _prepared_head(self, _result: None) -> None:
        self.starts += 1
        if self.on_prepared is not None:
            self.on_prepared()

    def _prepared_answer(self, _text: str) -> None:
        self.prepared += 1
        if self.on_prepared is not None:
            self.on_prepared()

    def _nearest(self) -> list[DefinitionSite]:
        """The focus file's definitions, nearest to the focus line first (at most `MAX_STARTS`)."""
        path, line = self.focus
        parsed = self.cache.index.definitions(path)
        if parsed is None:
            return []
        text, definitions = parsed
        nearest = sorted(definitions, key=lambda d: abs(d.line - line))[:MAX_STARTS]
        return [site_of(path, text, d, definitions) for d in nearest]

    def _next_head(self, looked_at: set[tuple[int, ...]]) -> list[PromptSegment] | None:
        """`[lead-in][head]` of the nearest definition not looked at yet whose head the engine
        does not hold."""
        if not self.session.settings.hover.prefetch_heads:
            return None
        lead = hover.lead_in(self.session)  # once per call, not once per definition
        for site in self._nearest():
            segments = hover.head_segments(self.session, site, lead)
            head = segments[-1].token_ids
            if head in looked_at:
                continue
            looked_at.add(head)
            if not self.session.backend.probe(segments).warm:
                return segments
        return None

    def _next_site(self) -> DefinitionSite | None:
        """The nearest definition to the focus without an answer, among the `limit` nearest."""
        files = self.session.prompt.files
        for site in self._nearest()[: self.limit]:
            key = self.cache.key(site, files)
            if key not in self.cache.answers and key not in self.cache.pending:
                return site
        return None

    def stop(self) -> None:
        """Cancels a running pass and its engine request (shutdown)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
