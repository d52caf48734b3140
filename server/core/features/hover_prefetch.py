"""Hover answers prepared in the background, for the file the user reads.

Once warm-up has nothing pending, the server works on the definitions of the
*focus* file (the one last opened, hovered or edited), in reading order from
the focus line: the definition there and those after it, top to bottom, then
those before it, nearest first. Two tiers:

1. answers: it generates the explanations of the first `hover.prefetch`
   definitions in that order and puts them in the hover cache: a later hover
   on one of them is answered at once. A prepared answer is exactly what the
   hover would have generated (same prompt, same greedy decoding). A reader
   moving down a file finds the answers there before they hover
   (`bench/lsp_reading.py`). The next `hover.prepareBatch` answers without
   one go to the engine together (`hover.start_batch`): on the NumPy forward
   they decode as one batch over their common lead-in (`engine.batch`), each
   stored as soon as it ends; 1 prepares them one by one. While a pass runs, a
   hover without an answer starts no generation of its own (`hover.explain`):
   it moves the focus, and the next batch starts with its definition.
2. answer heads (`hover.prefetchHeads`): then, for up to `MAX_STARTS`
   definitions nearest the focus without an answer, it prefills the hover
   lead-in plus the head (`hover.answer_start`) whose checkpoint the engine
   does not hold yet (`Backend.probe`): one forward call each, no decoding; a
   hover on one of them restores that checkpoint and computes one token before
   its first generated one (`hover.hover_segments`).

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
"""Answer heads prefilled per focus (the nearest definitions of the focused file without an answer)."""
MAX_DEFINITIONS = 256
"""Definitions of the focused file looked at (reading order from the focus)."""


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
            step = await self._next_step(looked_at)
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

    async def _next_step(self, looked_at: set[tuple[int, ...]]):
        """(task, what to do with its result) for the next answer or head, or None (also when warm-up got work
        while the lead-in was built)."""
        lead = await hover.current_lead_in(self.session)  # first: what follows it sees the state after the wait
        if self.busy():
            return None
        ordered = self._in_reading_order()
        sites = self._next_sites(ordered)
        if len(sites) > 1:
            return self._prepare_batch(sites, lead), lambda _result: None  # each answer counted as it lands
        if sites:
            key = self.cache.key(sites[0], self.session.prompt.files)
            return hover.start(self.session, self.cache, sites[0], key, time.perf_counter(), Priority.PREPARE,
                               lead), self._prepared_answer
        head = self._next_head(ordered, looked_at, lead)
        if head is not None:
            return self._prefill_head(head), self._prepared_head
        return None

    def _prefill_head(self, segments: list[PromptSegment]) -> asyncio.Task:
        async def prefill() -> None:
            done = await self.session.generate(segments, max_tokens=0, priority=Priority.PREPARE)
            if done.finish_reason == "cancelled":
                raise asyncio.CancelledError()
        return asyncio.ensure_future(prefill())

    def _prepare_batch(self, sites: list[DefinitionSite], lead: list[PromptSegment]) -> asyncio.Task:
        """The answers of `sites` generated together; the task ends when all have (an interrupted
        one is counted once per batch and generated again by the next step)."""
        files = self.session.prompt.files
        tasks = hover.start_batch(self.session, self.cache, sites, [self.cache.key(s, files) for s in sites], lead,
                                  Priority.PREPARE)
        for task in tasks:
            task.add_done_callback(self._answer_landed)

        async def wait() -> None:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            if any(isinstance(r, asyncio.CancelledError) for r in results):
                self.interrupted += 1  # the engine let more urgent work go first: try those again
            failed = next((r for r in results if isinstance(r, Exception)), None)
            if failed is not None:
                raise failed
        return asyncio.ensure_future(wait())

    def _answer_landed(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is None:
            self._prepared_answer(task.result())

    def _prepared_head(self, _result: None) -> None:
        self.starts += 1
        if self.on_prepared is not None:
            self.on_prepared()

    def _prepared_answer(self, _text: str) -> None:
        self.prepared += 1
        if self.on_prepared is not None:
            self.on_prepared()

    def _in_reading_order(self) -> list[DefinitionSite]:
        """The focus file's definitions in reading order from the focus line: the one the line
        is in and those after it, top to bottom, then those before it, nearest first."""
        path, line = self.focus
        parsed = self.cache.index.definitions(path)
        if parsed is None:
            return []
        text, definitions = parsed
        before = [d for d in definitions if d.line <= line]
        start = before[-1].line if before else line  # the definition the focus line is in
        ahead = sorted((d for d in definitions if d.line >= start), key=lambda d: d.line)
        behind = sorted((d for d in definitions if d.line < start), key=lambda d: -d.line)
        return [site_of(path, text, d, definitions) for d in (ahead + behind)[:MAX_DEFINITIONS]]

    def _next_head(self, ordered: list[DefinitionSite], looked_at: set[tuple[int, ...]], lead: list[PromptSegment]
                   ) -> list[PromptSegment] | None:
        """`[lead-in][head]` of the nearest definition without an answer, not looked at yet,
        whose head the engine does not hold."""
        if not self.session.settings.hover.prefetch_heads:
            return None
        path, line = self.focus
        files = self.session.prompt.files
        unanswered = [site for site in ordered if self.cache.key(site, files) not in self.cache.answers]
        nearest = sorted(unanswered, key=lambda site: abs(site.definition.line - line))[:MAX_STARTS]
        for site in nearest:
            segments = hover.head_segments(self.session, site, lead)
            head = segments[-1].token_ids
            if head in looked_at:
                continue
            looked_at.add(head)
            if not self.session.backend.probe(segments).warm:
                return segments
        return None

    def _next_sites(self, ordered: list[DefinitionSite]) -> list[DefinitionSite]:
        """The first `hover.prepareBatch` definitions in reading order without an answer (none
        generating either), among the first `limit`."""
        files, most = self.session.prompt.files, self.session.settings.hover.prepare_batch
        sites = []
        for site in ordered[: self.limit]:
            key = self.cache.key(site, files)
            if key not in self.cache.answers and key not in self.cache.pending:
                sites.append(site)
                if len(sites) >= most:
                    break
        return sites

    def stop(self) -> None:
        """Cancels a running pass and its engine request (shutdown)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
