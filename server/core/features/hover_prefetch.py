"""Hover answers prepared in the background, for the definitions where the user works.

When the engine has nothing else to do (warm-up finished, no request running),
the server works on the definitions nearest to the *focus* (the line last
opened, hovered or edited) in that file, nearest first, in two tiers:

1. answer heads (`hover.prefetchHeads`): it prefills the hover lead-in plus
   "`` `name` ``" of up to `MAX_STARTS` definitions (one short forward call each, no decoding), so a
   hover on one of them restores that checkpoint and computes one token before
   its first generated one (`hover.hover_segments`);
2. answers: it generates the explanations of the `hover.prefetch` nearest and
   puts them in the hover cache: a later hover on one of them is answered at
   once. A prepared answer is exactly what the hover would have generated
   (same prompt, same greedy decoding).

Interactive work comes first. Every interactive request (hover on another
symbol, ask, code action) interrupts a running preparation: its engine request
is cancelled and rolled back, and the symbol is tried again once the
interactive request is done. Edits interrupt it too and preparation waits
until warm-up has caught up. Like warm-up, it is background work: off when
`warmup.enabled` is false.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Callable

from engine.request import Priority

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
        busy: True while warm-up has work to do (preparation waits for it).
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
        self._current: asyncio.Task | None = None
        self._interactive = 0

    @property
    def limit(self) -> int:
        return self.session.settings.hover.prefetch

    def focus_on(self, path: Path, line: int) -> None:
        """Prepare around `path`:`line` (1-based) from now on."""
        self.focus = (path, line)
        self.kick()

    def kick(self) -> None:
        """Start preparing if there is something to prepare and nothing else runs."""
        if self._loop_task is not None and not self._loop_task.done():
            return
        settings = self.session.settings
        if ((self.limit <= 0 and not settings.hover.prefetch_heads) or not settings.warmup.enabled
                or self.focus is None or self._interactive):
            return
        self._loop_task = asyncio.ensure_future(self._run())

    def interrupt(self) -> None:
        """Cancel a running preparation (an interactive request or an edit needs the engine)."""
        if self._current is not None and not self._current.done():
            self._current.cancel()
            self.interrupted += 1

    def interactive_started(self) -> None:
        self._interactive += 1
        self.interrupt()

    def interactive_done(self) -> None:
        self._interactive -= 1
        self.kick()

    def state(self) -> dict:
        return {"prepared": self.prepared, "startsPrepared": self.starts, "interrupted": self.interrupted,
                "running": self._current is not None and not self._current.done()}

    async def _run(self) -> None:
        while not self.busy() and not self._interactive:
            start = self._next_start()
            if start is not None:
                job, done = self._prefill_start(*start), self._started_start
            else:
                site = self._next_site()
                if site is None:
                    return
                key = self.cache.key(site, self.session.prompt.files)
                job = hover.start(self.session, self.cache, site, key, time.perf_counter(), Priority.BACKGROUND)
                done = self._prepared_answer
            self._current = job
            try:
                result = await asyncio.shield(job)
            except asyncio.CancelledError:
                if not job.cancelled():
                    raise  # this loop itself was cancelled (stop)
                logger.debug("hover preparation interrupted")
                return
            except Exception as err:  # noqa: BLE001 - a failed preparation only costs the cache entry
                logger.warning("hover preparation failed: %s", err)
                return
            done(result)

    def _prefill_start(self, segments, key) -> asyncio.Task:
        async def prefill():
            done = await self.session.generate(segments, max_tokens=0, priority=Priority.BACKGROUND)
            if done.finish_reason == "cancelled":
                raise asyncio.CancelledError()
            return key
        return asyncio.ensure_future(prefill())

    def _started_start(self, key) -> None:
        self.cache.starts[key] = True
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

    def _next_start(self):
        """(segments, key) of the nearest definition whose answer head is not prefilled yet."""
        if not self.session.settings.hover.prefetch_heads:
            return None
        lead = hover.lead_in(self.session)  # once per call, not once per definition
        digest = hover.lead_digest(lead)
        for site in self._nearest():
            segments, key = hover.start_segments(self.session, site, lead, digest)
            if key not in self.cache.starts:
                return segments, key
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
        self.interrupt()
        if self._loop_task is not None:
            self._loop_task.cancel()
