"""What one server instance holds: settings, buffers, the engine and the prompt.

Features receive a `Session` and call `generate`; they never touch pygls.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from context.access import quoted_name
from context.errors import AccessDeniedError
from context.scan import Skipped
from engine.request import DoneEvent, Priority, PromptSegment, Request, TokenEvent

from .errors import NotReadyError
from .settings import Settings
from .warmth import PrefixRecord

logger = logging.getLogger(__name__)


class Buffers(Protocol):
    """The editor's open buffers as the core reads them (`server.lsp.documents.DocumentStore`)."""

    def by_path(self, path: Path) -> Any:
        """The open buffer at `path` (with its `.text`), or None."""

    def __len__(self) -> int:
        """How many buffers are open."""


@dataclass
class Counters:
    """Server-side counters reported by `codectx.status`."""

    asks: int = 0
    hovers: int = 0
    hover_cache_hits: int = 0
    cancelled: int = 0
    warmups: int = 0
    last_metrics: dict = field(default_factory=dict)
    last_hover: dict | None = None  # firstTokenS/totalS from the hover request, promptTokens


class Session:
    """State shared by all features.

    Args:
        settings: The parsed settings.
        documents: The open buffers (the transport's store).
        root: The workspace folder (None before `initialize`).
    """

    def __init__(self, settings: Settings, documents: Buffers, root: Path | None) -> None:
        self.settings = settings
        self.documents = documents
        self.root = root
        self.engine: Any = None
        self.tokenizer: Any = None
        self.prompt: Any = None  # a `WorkspacePrompt` once loaded
        self.counters = Counters()
        self.model_id: str | None = None
        self.prefix_version = 0  # bumped on every edit
        self.prefilled = PrefixRecord()
        self._running: set[str] = set()
        # Called when an interactive request starts and ends (background work steps aside).
        self.interactive_hooks: tuple[Callable[[], None], Callable[[], None]] | None = None

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.prompt is not None

    def attach(self, engine: Any, tokenizer: Any, prompt: Any, model_id: str) -> None:
        """Installs the loaded engine (called once the model is loaded)."""
        self.engine, self.tokenizer, self.prompt, self.model_id = engine, tokenizer, prompt, model_id

    def require_ready(self) -> None:
        """Raises:
            NotReadyError: The model or workspace is still loading.
        """
        if not self.ready:
            raise NotReadyError("codectx is still loading the model; try again in a moment")

    def buffer_text(self, path: Path) -> str | None:
        """Unsaved text of an open buffer at `path`, else None."""
        doc = self.documents.by_path(path)
        return doc.text if doc is not None else None

    def read_text(self, path: Path) -> str:
        """A workspace file's current text (the open buffer, else the disk), through the
        workspace's access policy: what the policy refuses is never read.

        Raises:
            NotReadyError: The workspace is not scanned yet.
            AccessDeniedError: The policy refuses the path (with its reason).
        """
        if self.prompt is None:
            raise NotReadyError("codectx is still scanning the workspace; try again in a moment")
        access = self.prompt.access
        text = self.buffer_text(path)
        item = access.admit(path, text) if text is not None else access.read(path)
        if isinstance(item, Skipped):
            raise AccessDeniedError(f"{quoted_name(item.path)}: {item.reason}")
        return item.text

    async def generate(self, segments: list[PromptSegment], *, max_tokens: int,
                       on_text: Callable[[str], None] | None = None, stop: tuple[str, ...] = (),
                       priority: Priority = Priority.INTERACTIVE,
                       on_prefill: Callable[[int, int], None] | None = None) -> DoneEvent:
        """Runs one engine request, streaming text to `on_text`.

        `on_prefill(done, total)` runs on the event loop after each prefill chunk.
        Cancelling the awaiting task cancels the engine request (which rolls
        back to its last confirmed checkpoint) and re-raises CancelledError.

        Returns:
            The request's `DoneEvent`.
        """
        self.require_ready()
        hooks = self.interactive_hooks if priority == Priority.INTERACTIVE else None
        if hooks is not None:
            hooks[0]()
        try:
            return await self._generate(segments, max_tokens, on_text, stop, priority, on_prefill)
        finally:
            if hooks is not None:
                hooks[1]()

    async def _generate(self, segments, max_tokens, on_text, stop, priority, on_prefill) -> DoneEvent:
        request = Request(segments=segments, max_tokens=max_tokens, stop=stop, priority=priority)
        loop = asyncio.get_running_loop()
        chunk_callback = None
        if on_prefill is not None:
            def chunk_callback(done: int, total: int) -> None:  # worker thread
                loop.call_soon_threadsafe(on_prefill, done, total)
        handle = self.engine.submit(request, on_progress=chunk_callback)
        self._running.add(request.request_id)
        try:
            async for event in handle:
                if isinstance(event, TokenEvent):
                    if on_text is not None and event.text:
                        on_text(event.text)
                elif isinstance(event, DoneEvent):
                    self.counters.last_metrics = event.metrics.as_dict()
                    if event.error is not None and event.finish_reason == "error":
                        raise event.error
                    if event.finish_reason in ("stop", "length"):
                        self.prefilled.record(segments)
                    return event
            raise RuntimeError(f"engine stream for {request.request_id} ended without DoneEvent")
        except asyncio.CancelledError:
            if priority == Priority.INTERACTIVE:  # background work (warm-up, hover preparation) is not counted
                self.counters.cancelled += 1
            self.engine.cancel(request.request_id)
            raise
        finally:
            self._running.discard(request.request_id)

    def warm_tokens(self, prefix: list[PromptSegment]) -> int:
        """Tokens of `prefix` the engine can restore (see `warmth.PrefixRecord`)."""
        if self.engine is None:
            return 0
        checkpoints = self.engine.stats()["cache"].get("checkpoint_list", [])
        return self.prefilled.warm_tokens(prefix, [c["end"] for c in checkpoints])

    def on_warm_prefix(self, segments: list[PromptSegment]) -> list[PromptSegment]:
        """`segments` on the last prefilled prefix while edits wait for warm-up (`PrefixRecord.on_warm_prefix`)."""
        if self.engine is None:
            return segments
        checkpoints = self.engine.stats()["cache"].get("checkpoint_list", [])
        return self.prefilled.on_warm_prefix(segments, [c["end"] for c in checkpoints])

    def cancel_all(self) -> None:
        """Cancels every running engine request (shutdown)."""
        for request_id in list(self._running):
            self.engine.cancel(request_id)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
