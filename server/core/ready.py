"""The loaded session as a server runs it: a `Session` plus its background work.

`ReadySession` is created once the model and the workspace are loaded, and
from then on always has its backend, prompt, warm-up, hover preparation and
tools: nothing in it is "not loaded yet".
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable

from context.scan import ScanProgress

from .backend import Backend
from .features import hover as hover_feature
from .features.hover_prefetch import HoverPrefetch
from .prefix_budget import server_context
from .prompt import WorkspacePrompt
from .session import LoadingSession, Session
from .tools import TOOLS_PROMPT, WorkspaceTools
from .warmup import Warmup

logger = logging.getLogger(__name__)


def workspace_prompt(base: LoadingSession, tokenizer, context_length: int,
                     progress: ScanProgress | None = None) -> WorkspacePrompt:
    """The workspace's prompt over `base`'s root, buffers and context settings, its budget within what a
    model's context of `context_length` tokens leaves (`server_context`) (scans: blocking).

    Raises:
        ContextError: The workspace cannot be scanned.
        ScanStopped: `progress` stopped the scan.
    """
    return WorkspacePrompt(base.root, tokenizer, base.buffer_text, TOOLS_PROMPT,
                           server_context(base.settings, context_length), progress)


class ReadySession(Session):
    """A loaded session with warm-up, hover preparation and workspace tools.

    Args:
        base: The session as it was while loading (its buffers edited meanwhile are
            marked dirty in `prompt`).
        backend: The started backend.
        prompt: The workspace prompt.
        on_warmth: Called with the warm-up state (and the hover preparation's) while a
            warm-up runs, after each one and after each prepared hover.
    """

    def __init__(self, base: LoadingSession, backend: Backend, prompt: WorkspacePrompt,
                 on_warmth: Callable[[dict], None] = lambda state: None) -> None:
        super().__init__(base, backend, prompt)
        self.on_warmth = on_warmth
        self.tools = WorkspaceTools(prompt.access, self.read_text, lambda: prompt.files)
        self.hover_cache = hover_feature.HoverCache(self.read_text, prompt.workspace.tags)
        lead_in = hover_feature.lead_in if base.settings.hover.enabled else None
        self.warmup = Warmup(self, self._warmup_state, lead_in=lead_in)
        self.prefetch = HoverPrefetch(self, self.hover_cache, busy=lambda: self.warmup.busy,
                                      on_prepared=lambda: self._report(self.warmup.state()))
        for path in sorted(base.dirty):
            prompt.mark_dirty(path)
        base.dirty.clear()

    def start(self, focus: tuple[Path, int] | None = None) -> None:
        """Starts the first warm-up; hover preparation follows it at `focus` (path, 1-based line)."""
        if focus is not None and self.settings.hover.enabled:
            self.prefetch.focus = focus  # prepared once the start-up warm-up is done
        self.warmup.schedule(0)

    def _warmup_state(self, state: dict) -> None:
        """Reports warmth; once warm-up is idle, prepares hovers."""
        self._report(state)
        # Called from inside the warm-up task: look again once that task has ended.
        asyncio.get_running_loop().call_soon(self._kick_if_idle)

    def _report(self, state: dict) -> None:
        """Reports warmth (warm-up + prepared hovers)."""
        self.on_warmth(dict(state, hoverPrefetch=self.prefetch.state()))

    def _kick_if_idle(self) -> None:
        if not self.warmup.busy:
            self.prefetch.kick()

    def focus(self, path: Path, line: int) -> None:
        """The user works at `path`:`line` (1-based): prepare hovers there (`HoverPrefetch`)."""
        if self.settings.hover.enabled:
            self.prefetch.focus_on(path, line)

    def edited(self, paths: list[Path]) -> None:
        """Buffers or files changed: the prompt re-reads them and warm-up follows after the
        debounce (hover preparation starts no new step meanwhile, and the engine runs the
        warm-up before any preparation: `engine.request.Priority`)."""
        for path in paths:
            self.prompt.mark_dirty(path)
            self.warmup.schedule(self.settings.warmup.debounce_ms / 1000, path)

    async def reindex(self) -> int:
        """Rescans the workspace (on the prompt's thread: seconds on a large repository) and warms it up again;
        returns the number of files in it. A cancelled request does not stop the rescan, nor the warm-up after it."""
        rescan = asyncio.ensure_future(self.prompt.call(self.prompt.rescan))
        rescan.add_done_callback(self._rescanned)
        await asyncio.shield(rescan)
        return len(self.prompt.files)

    def _rescanned(self, rescan: asyncio.Future) -> None:
        if not rescan.cancelled() and rescan.exception() is None:
            self.base.prefix_version += 1
            self.warmup.schedule(0)

    def stop(self) -> None:
        """Stops warm-up and hover preparation and cancels this session's requests (idempotent)."""
        self.warmup.stop()
        self.prefetch.stop()
        self.cancel_all()
