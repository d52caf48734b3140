"""One workspace's session through its two phases, for a transport to hold.

A `SessionHost` starts with a `LoadingSession` (settings, buffers, root) and,
once `load` has started the backend and scanned the workspace, holds a
`ReadySession`. Handlers ask it for the ready session: `ready()` waits for
it (and raises the load error if loading failed), `ready_now()` answers None
while loading, for requests whose right answer then is "nothing yet". Edits
and focus changes that arrive while loading are kept and applied once ready.
It is also the `SessionProvider` a transport beside the editor reads.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from context.errors import ScanStopped
from context.scan import ScanProgress

from .backend import Backend, start_backend
from .errors import NotReadyError
from .features import hover as hover_feature
from .features.symbols import DefinitionIndex
from .ready import ReadySession, workspace_prompt
from .session import LoadingSession
from .settings import Settings

logger = logging.getLogger(__name__)
T = TypeVar("T")
LOADING = "codectx is still loading the model; try again in a moment"
RESTART_SECTIONS = ("model", "compute", "memory", "engine", "context")
"""Settings a loaded session was built with (the model, its compute paths, its caches, the engine it talks to,
the workspace it scanned): a change applies at the next start."""


class SessionHost:
    """The session of one workspace, loading then ready.

    Args:
        base: The loading session (from the transport's `initialize`).
        on_warmth: Passed to the `ReadySession` (warm-up and hover preparation state).
    """

    def __init__(self, base: LoadingSession, on_warmth: Callable[[dict], None] = lambda state: None) -> None:
        self.base = base
        self.on_warmth = on_warmth
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loaded: asyncio.Future[ReadySession] | None = None
        self._starting: asyncio.Future[Backend] | None = None
        self._focus: tuple[Path, int] | None = None
        self._closed = False
        self._card_index: DefinitionIndex | None = None

    def begin(self) -> None:
        """Marks the start of loading on the running loop: from now on `ready()` waits."""
        self.loop = asyncio.get_running_loop()
        self._loaded = self.loop.create_future()
        self._loaded.add_done_callback(lambda f: f.cancelled() or f.exception())  # raised to waiters

    async def load(self, stage: Callable[[str], None] = lambda message: None,
                   start: Callable[[Settings], Backend] = start_backend) -> ReadySession:
        """Starts the backend and scans the workspace (both off the loop), then starts warm-up.

        Args:
            stage: Told what loading does next ("scanning ...").
            start: Builds the backend from the settings (blocking; runs on a worker thread).

        Raises:
            ModelNotFoundError, ModelLoadError: As `start_backend`.
            ContextError: The workspace cannot be scanned.
            NotReadyError: The host was closed while loading.
        """
        if self._loaded is None:
            self.begin()
        try:
            ready = await self._load(stage, start)
        except BaseException as err:
            self.failed(err if isinstance(err, Exception) else NotReadyError("codectx was shut down while loading"))
            raise
        self._loaded.set_result(ready)
        ready.start(self._focus)
        return ready

    async def _load(self, stage: Callable[[str], None], start: Callable[[Settings], Backend]) -> ReadySession:
        self._starting = self.loop.run_in_executor(None, start, self.base.settings)
        try:
            backend = await asyncio.shield(self._starting)
        except asyncio.CancelledError:
            self._starting.add_done_callback(_close_when_started)  # the thread runs on: close what it starts
            raise
        stop = threading.Event()
        try:
            if self._closed:
                raise NotReadyError("codectx was shut down while loading")
            stage(f"scanning {self.base.root}")
            progress = self._scan_progress(stage, stop)
            prompt = await asyncio.to_thread(workspace_prompt, self.base, backend.tokenizer, backend.context_length,
                                             progress)
            if self._closed:
                raise NotReadyError("codectx was shut down while loading")
        except ScanStopped:
            backend.close()
            raise NotReadyError("codectx was shut down while loading") from None
        except BaseException:
            stop.set()  # cancelled: the scan's thread stops at its next file or batch
            backend.close()
            raise
        return ReadySession(self.base, backend, prompt, self.on_warmth)

    def _scan_progress(self, stage: Callable[[str], None], stop: threading.Event) -> ScanProgress:
        """The scan's progress as `stage` messages (at most ~4 a second; called on the scan's
        thread). A `close` or `stop` stops the scan, so that an exit does not wait for it."""
        loop, shown = self.loop, [0.0]

        def progress(step: str, done: int, total: int) -> None:
            if self._closed or stop.is_set():
                raise ScanStopped
            now = time.monotonic()
            if done == total or now - shown[0] >= 0.25:
                shown[0] = now
                loop.call_soon_threadsafe(stage, f"scanning {self.base.root}: {step} {done}/{total} files")

        return progress

    def failed(self, err: Exception) -> None:
        """Loading failed (or never got to load): every waiting and later `ready()` raises `err`."""
        if self._loaded is None:
            self.begin()
        if not self._loaded.done():
            self._loaded.set_exception(err)

    def load_failure(self) -> BaseException | None:
        """The error that made loading fail; None while loading, once loaded, or before `initialize`."""
        loaded = self._loaded
        if loaded is None or not loaded.done() or loaded.cancelled():
            return None
        return loaded.exception()

    def ready_now(self) -> ReadySession | None:
        """The ready session, or None while loading (or after loading failed)."""
        loaded = self._loaded
        if loaded is None or not loaded.done() or loaded.cancelled() or loaded.exception() is not None:
            return None
        return loaded.result()

    def static_hover(self, name: str, current: Path) -> hover_feature.HoverAnswer | None:
        """While the model loads, or after it failed to: the hover's static card for `name` defined in
        `current` (no model request; the workspace is not scanned, so only that file is searched)."""
        if self._card_index is None:
            self._card_index = DefinitionIndex(self.base.read_text)
        failure = self.load_failure()
        note = hover_feature.LOADING_LINE if failure is None else hover_feature.NOT_LOADED_LINE
        return hover_feature.static_card(self._card_index, name, current, [current], note)

    async def ready(self) -> ReadySession:
        """The ready session, once loaded.

        Raises:
            NotReadyError: Loading has not begun (before `initialize`), or the host was closed.
            Exception: The error that made loading fail.
        """
        if self._loaded is None:
            raise NotReadyError(LOADING)
        return await asyncio.shield(self._loaded)

    def current(self) -> ReadySession | None:
        """`SessionProvider`: the ready session or None."""
        return self.ready_now()

    async def call(self, fn: Callable[[Any], T]) -> T:
        """`SessionProvider`: `fn(ready session)` on its prompt's thread, started from this host's loop, from any
        thread's loop.

        Raises:
            NotReadyError: The session is not ready.
        """
        if self.loop is None:
            raise NotReadyError(LOADING)

        async def run() -> T:
            ready = self.ready_now()
            if ready is None:
                raise NotReadyError(LOADING)
            return await ready.prompt.call(fn, ready)  # it may build a prompt (a fold takes seconds): off the loop

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))

    def focus(self, path: Path | None, line: int) -> None:
        """The user works at `path`:`line` (1-based): hovers are prepared there; kept until ready."""
        if path is None or not self.base.settings.hover.enabled:
            return
        ready = self.ready_now()
        if ready is None:
            self._focus = (path, line)
        else:
            ready.focus(path, line)

    def changed(self, paths: list[Path | None]) -> None:
        """Buffers or files changed (None: not a file): a new prefix version, and the prompt
        re-reads them (now, or once the workspace is scanned) and warm-up follows."""
        self.base.prefix_version += len(paths)
        files = [path for path in paths if path is not None]
        ready = self.ready_now()
        if ready is None:
            self.base.dirty.update(files)
        else:
            ready.edited(files)

    def reread(self, path: Path | None) -> None:
        """A buffer was opened or closed: the prompt reads `path` again (no warm-up of its own)."""
        if path is None:
            return
        ready = self.ready_now()
        if ready is None:
            self.base.dirty.add(path)
        else:
            ready.prompt.mark_dirty(path)

    def apply_settings(self, settings: Settings) -> list[str]:
        """Uses new settings. A loaded session keeps the sections it was built with
        (`RESTART_SECTIONS`) until a restart; returns those that changed (everything else
        applies at once)."""
        ready = self.ready_now()
        before = self.base.settings
        kept = [name for name in RESTART_SECTIONS if getattr(settings, name) != getattr(before, name)] \
            if ready is not None else []
        self.base.settings = dataclasses.replace(settings, **{name: getattr(before, name) for name in kept})
        if ready is not None and settings.window != before.window:
            ready.backend.set_window(settings.window)  # from the next request on
        if ready is not None and settings.generation != before.generation:
            ready.backend.set_generation(settings.generation)
        return kept

    def shutdown(self) -> None:
        """Stops background work and cancels running requests (LSP `shutdown`; idempotent)."""
        ready = self.ready_now()
        if ready is not None:
            ready.stop()

    def close(self) -> None:
        """Ends the session: loading stops (a backend still starting is closed once it is up),
        waiters get NotReadyError, a ready session's backend closes. Idempotent."""
        self._closed = True
        self.failed(NotReadyError("codectx was shut down while loading"))
        self.shutdown()
        ready = self.ready_now()
        if ready is not None:
            ready.close()

    async def wait_closed(self) -> None:
        """After `close`: waits until a backend that was still starting is up and closed too
        (for a caller that lives on after closing the host)."""
        starting = self._starting
        if starting is None:
            return
        try:
            backend = await asyncio.shield(starting)
        except Exception:  # noqa: BLE001 - a start that failed left nothing to close
            return
        backend.close()


def _close_when_started(starting: asyncio.Future) -> None:
    if not starting.cancelled() and starting.exception() is None:
        starting.result().close()
