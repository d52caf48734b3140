"""A session in two phases: loading, then loaded.

`LoadingSession` is what a server has from `initialize` on: settings, the
open buffers, the workspace root, counters. `Session` is built from it once
the model and the workspace are loaded, with a backend and a prompt that are
never missing; features receive a `Session` and call `generate`, and never
touch pygls. (`server.core.ready.ReadySession` adds the server's background
work; `server.core.host.SessionHost` goes from one phase to the other.)
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

from context.access import AccessPolicy, quoted_name
from context.errors import AccessDeniedError
from context.home import codectx_home
from context.scan import ScanRules, Skipped
from engine.request import DoneEvent, Priority, PromptSegment, Request, SamplingParams

from .backend import Backend
from .outcomes import REQUEST_KIND, Outcomes
from .prompt import Conversations, WorkspacePrompt
from .settings import Settings
from .warmth import on_warm_prefix

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Buffers(Protocol):
    """The editor's open buffers as the core reads them (`server.lsp.documents.DocumentStore`)."""

    def by_path(self, path: Path) -> Any:
        """The open buffer at `path` (with its `.text`), or None."""

    def __len__(self) -> int:
        """How many buffers are open."""


class NoBuffers:
    """No open buffers: a session without an editor (`codectx ask`)."""

    def by_path(self, path: Path) -> None:
        return None

    def __len__(self) -> int:
        return 0


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
    outcomes: Outcomes = field(default_factory=Outcomes)  # requests by kind and outcome


class LoadingSession:
    """What a session holds before the model is up, and keeps after.

    Args:
        settings: The parsed settings (replaced when the client sends new ones).
        documents: The open buffers (the transport's store).
        root: The workspace folder.
    """

    def __init__(self, settings: Settings, documents: Buffers, root: Path) -> None:
        self.settings = settings
        self.documents = documents
        self.root = root
        self.no_folder = False  # set by a transport whose client opened no folder (`root` is then `empty_root()`)
        self.counters = Counters()
        self.conversations = Conversations()  # earlier asks' turns, by conversation id
        self.prefix_version = 0  # bumped on every edit
        self.dirty: set[Path] = set()  # edited while loading: the prompt reads them once built
        self._access: tuple[tuple, AccessPolicy] | None = None

    def buffer_text(self, path: Path) -> str | None:
        """Unsaved text of an open buffer at `path`, else None."""
        doc = self.documents.by_path(path)
        return doc.text if doc is not None else None

    def read_text(self, path: Path) -> str:
        """A workspace file's current text before the workspace is built (a hover's static card
        while the model loads), through an access policy with the workspace's rules.

        Raises:
            AccessDeniedError: The policy refuses the path (with its reason).
        """
        return read_through(self._policy(), self.buffer_text(path), path)

    def name_refusal(self, path: Path) -> str | None:
        """Why the workspace's access policy refuses `path` by its name or its way (outside the workspace, git's
        metadata, a secret, a link out: `AccessPolicy.edit_refusal`), without reading it; None when it does not."""
        return self._policy().edit_refusal(path)

    def _policy(self) -> AccessPolicy:
        context = self.settings.context
        rules = (self.root, context.include, context.exclude, context.deny)
        if self._access is None or self._access[0] != rules:
            self._access = (rules, AccessPolicy(self.root, ScanRules(context.include, context.exclude), context.deny))
        return self._access[1]



def empty_root() -> Path:
    """The workspace root of a client that opened no folder: an empty folder of ours (created
    here), so that nothing is scanned rather than whatever folder the server started in."""
    root = codectx_home() / "no-workspace"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:  # the load then says the folder cannot be used
        pass
    return root.resolve()

def read_through(access: AccessPolicy, buffer: str | None, path: Path) -> str:
    """`path`'s text, the open `buffer` if there is one, else the disk, as `access` admits it.

    Raises:
        AccessDeniedError: The policy refuses the path (with its reason).
    """
    item = access.admit(path, buffer) if buffer is not None else access.read(path)
    if isinstance(item, Skipped):
        raise AccessDeniedError(f"{quoted_name(item.path)}: {item.reason}")
    return item.text


class Session:
    """A loaded session: the backend and the workspace prompt, never missing.

    Settings, buffers, root, counters and conversations are the `LoadingSession`'s (shared, so a
    settings change reaches both phases).

    Args:
        base: The session as it was while loading.
        backend: The started backend.
        prompt: The workspace's `WorkspacePrompt`.
    """

    def __init__(self, base: LoadingSession, backend: Backend, prompt: WorkspacePrompt) -> None:
        self.base = base
        self.backend = backend
        self.prompt = prompt
        self._running: set[str] = set()

    @property
    def settings(self) -> Settings:
        return self.base.settings

    @property
    def documents(self) -> Buffers:
        return self.base.documents

    @property
    def root(self) -> Path:
        return self.base.root

    @property
    def counters(self) -> Counters:
        return self.base.counters

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    @property
    def model_id(self) -> str:
        return self.backend.model_id

    def buffer_text(self, path: Path) -> str | None:
        """Unsaved text of an open buffer at `path`, else None."""
        return self.base.buffer_text(path)

    def edit_refusal(self, path: Path) -> str | None:
        """Why an edit proposed to the editor may not name `path` (`AccessPolicy.edit_refusal`), or None."""
        return self.prompt.access.edit_refusal(path)

    def read_text(self, path: Path) -> str:
        """A workspace file's current text (the open buffer, else the disk), through the
        workspace's access policy: what the policy refuses is never read.

        Raises:
            AccessDeniedError: The policy refuses the path (with its reason).
        """
        return read_through(self.prompt.access, self.buffer_text(path), path)

    async def generate(self, segments: list[PromptSegment], *, max_tokens: int,
                       on_text: Callable[[str], None] | None = None, stop: tuple[str, ...] = (),
                       priority: Priority = Priority.INTERACTIVE,
                       on_prefill: Callable[[int, int], None] | None = None,
                       sampling: SamplingParams | None = None) -> DoneEvent:
        """Runs one backend request, streaming text to `on_text`.

        `on_prefill(done, total)` runs on the event loop after each prefill chunk;
        `sampling` defaults to greedy. The backend runs requests in `priority` order
        (interactive work first; see `engine.request.Priority`).
        Cancelling the awaiting task cancels the request (which rolls back to its
        last confirmed checkpoint) and re-raises CancelledError.

        Returns:
            The request's `DoneEvent`.

        Raises:
            EngineError: The request failed (its metrics are in `counters.last_metrics`).
        """
        request = Request(segments=segments, max_tokens=max_tokens, stop=stop, priority=priority,
                          sampling=sampling or SamplingParams())
        self._running.add(request.request_id)
        kind, outcome = REQUEST_KIND.get(), "error"
        try:
            done = await self.backend.generate(request, on_text=on_text, on_prefill=on_prefill)
            outcome = done.finish_reason
        except asyncio.CancelledError:
            outcome = "cancelled"
            if request.priority == Priority.INTERACTIVE:  # background work (warm-up, hover preparation) is not counted
                self.counters.cancelled += 1
            raise
        finally:
            self._running.discard(request.request_id)
            if kind is not None and request.priority == Priority.INTERACTIVE:
                self.counters.outcomes.record(kind, outcome)
        if request.priority == Priority.INTERACTIVE:  # a warm-up's metrics (no tokens, TTFT 0) would read as an answer's
            self.counters.last_metrics = done.metrics.as_dict()
        if done.error is not None and done.finish_reason == "error":
            raise done.error
        return done

    def warm_tokens(self, prefix: list[PromptSegment]) -> int:
        """Tokens of `prefix` the backend can restore (`Backend.probe`)."""
        return self.backend.probe(prefix).warm_tokens

    def on_warm_prefix(self, segments: list[PromptSegment]) -> list[PromptSegment]:
        """`segments` on the prefix the backend last prefilled while edits wait for warm-up
        (`server.core.warmth.on_warm_prefix` over `Backend.warm_prefix`)."""
        return on_warm_prefix(segments, self.backend.warm_prefix())

    def cancel_all(self) -> None:
        """Cancels every running request of this session (shutdown, Ctrl-C)."""
        for request_id in list(self._running):
            self.backend.cancel(request_id)

    def close(self) -> None:
        """Stops the backend and the prompt's thread (idempotent); later requests fail with EngineClosedError."""
        self.backend.close()
        self.prompt.close()


class SessionProvider(Protocol):
    """Where a transport beside the editor (HTTP with `--stdio`) gets the editor's session:
    one engine, one set of checkpoints, one workspace."""

    def current(self) -> Session | None:
        """The session once its model and workspace are loaded, else None."""

    async def call(self, fn: Callable[[Session], T]) -> T:
        """`fn(session)` on the prompt's thread (`WorkspacePrompt.call`), started from the session's own event loop
        (building may fold the hot tail: seconds on a large repository).

        Raises:
            NotReadyError: The session is not loaded (yet, or any more).
        """
