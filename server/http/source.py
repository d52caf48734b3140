"""Where the HTTP side gets its backend: the editor's session, or one of its own.

`EngineSource` is what the app needs: the backend that is up (or None while
loading), the names it answers to, and the repository prompt for the
`codectx` model. `SessionSource` reads a core `SessionProvider` (the language
server's session in the same process: one engine, one set of checkpoints) and
builds repository prompts on that session's event loop, where the workspace
lives. `StandaloneSource` owns a backend started by the core's `start_backend`,
for `codectx serve --http` without an editor.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from context.focus_query import FocusQuery
from engine.request import Priority, PromptSegment, Request
from server.core.backend import Backend, start_backend
from server.core.errors import NotReadyError
from server.core.features.ask import focus_of
from server.core.outcomes import Outcomes
from server.core.prefix_budget import server_context
from server.core.prompt import Turn, WorkspacePrompt
from server.core.session import Session, SessionProvider
from server.core.settings import Settings
from server.core.tools import TOOLS_PROMPT

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """The backend that is up and what it answers to.

    Attributes:
        backend: The core `Backend` (model id, tokenizer, context length, submit, stats).
        aliases: Other names accepted for the plain model (the configured name).
        has_repository: True when the `codectx` repository model is available.
    """

    backend: Backend
    aliases: tuple[str, ...] = ()
    has_repository: bool = False

    @property
    def model_id(self) -> str:
        """The loaded model's id (listed by /v1/models)."""
        return self.backend.model_id

    @property
    def tokenizer(self) -> Any:
        return self.backend.tokenizer

    @property
    def context_length(self) -> int:
        """The model's context window in tokens."""
        return self.backend.context_length


class EngineSource(Protocol):
    """What the HTTP app reads its backend and repository prompt from."""

    def current(self) -> Served | None:
        """The backend that is up, or None while the model loads."""

    async def repository_segments(self, turns: Sequence[tuple[str, str]]) -> list[PromptSegment]:
        """The workspace prompt with these (role, content) turns; the last is the question."""

    def outcomes(self) -> Outcomes | None:
        """Where requests are counted by kind and outcome (beside the editor: its session's, with
        its asks and hovers), or None while the model loads."""


def _turns(turns: Sequence[tuple[str, str]]) -> list[Turn]:
    return [Turn(role, content) for role, content in turns]


def _aliases(name: str, model_id: str) -> tuple[str, ...]:
    """The configured model name (and its last path part) when it differs from the model id."""
    return tuple(a for a in {name, Path(name).name} if a and a != model_id)


class StandaloneSource:
    """A backend of its own, plus an optional workspace for the repository model.

    Args:
        backend: A started core `Backend`.
        name: The name the model was asked for (accepted as an alias).
        prompt: A `WorkspacePrompt`, or None.
        settings: The settings (`focus.*` and `ask.maxTokens` size the focus of the repository model).
    """

    def __init__(self, backend: Backend, name: str = "", prompt: WorkspacePrompt | None = None,
                 settings: Settings | None = None) -> None:
        self.backend = backend
        self.prompt = prompt
        self.settings = settings or Settings()
        self._served = Served(backend, _aliases(name, backend.model_id), prompt is not None)
        self._outcomes = Outcomes()

    @classmethod
    def start(cls, model: str, *, workspace: Path | None = None, settings: Settings | None = None) -> StandaloneSource:
        """Load `model` (blocking) with the core's settings and `start_backend`.

        Raises:
            ModelNotFoundError, ModelLoadError: As `start_backend`.
            ContextError: The workspace cannot be scanned.
        """
        settings = settings or Settings()
        settings = dataclasses.replace(settings, model=dataclasses.replace(settings.model, name=model))
        backend = start_backend(settings)
        try:
            prompt = build_workspace_prompt(workspace, backend, settings) if workspace else None
        except BaseException:
            backend.close()
            raise
        source = cls(backend, model, prompt, settings)
        if prompt is not None:
            source.warm()
        return source

    def current(self) -> Served:
        return self._served

    def outcomes(self) -> Outcomes:
        return self._outcomes

    async def repository_segments(self, turns: Sequence[tuple[str, str]]) -> list[PromptSegment]:
        if self.prompt is None:
            raise LookupError("no workspace")
        chat = _turns(turns)

        def build() -> list[PromptSegment]:
            focus = self.prompt.fitted_focus(FocusQuery(chat[-1].content), chat, self.settings.focus,
                                             self.backend.context_length, self.settings.ask.max_tokens)
            return self.prompt.segments(chat, focus.segments if focus is not None else ())

        return await self.prompt.call(build)  # the prompt may apply changes (a fold takes seconds): off the loop

    def warm(self) -> None:
        """Prefill the workspace prefix in the background (interactive requests go first)."""
        segments = self.prompt.prefix_segments()
        if segments:
            self.backend.submit(Request(segments=segments, max_tokens=0, priority=Priority.BACKGROUND))

    def close(self) -> None:
        self.backend.close()
        if self.prompt is not None:
            self.prompt.close()


def build_workspace_prompt(root: Path, backend: Any, settings: Settings) -> WorkspacePrompt:
    """The core's prompt for `root` (`WorkspacePrompt`: one builder, one access policy), no buffers;
    its budget within what `backend`'s context leaves (`server_context`)."""
    def no_buffers(path: Path) -> None:
        return None

    return WorkspacePrompt(root, backend.tokenizer, no_buffers, TOOLS_PROMPT,
                           server_context(settings, backend.context_length))


class SessionSource:
    """The backend and workspace of a core session in the same process (the editor's).

    Args:
        provider: The `SessionProvider` (asked on each call: the session comes and goes).
    """

    def __init__(self, provider: SessionProvider) -> None:
        self.provider = provider

    def current(self) -> Served | None:
        session = self.provider.current()
        if session is None:
            return None
        return Served(session.backend, _aliases(session.settings.model.name, session.backend.model_id), True)

    def outcomes(self) -> Outcomes | None:
        session = self.provider.current()
        return session.counters.outcomes if session is not None else None

    async def repository_segments(self, turns: Sequence[tuple[str, str]]) -> list[PromptSegment]:
        """The editor's workspace prompt, with the focus of the last message (`focus.*`), as an ask's."""
        def build(session: Session) -> list[PromptSegment]:
            chat = _turns(turns)
            focus = focus_of(session, FocusQuery(chat[-1].content), chat, session.settings.ask.max_tokens)
            return session.prompt.segments(chat, focus.segments if focus is not None else ())

        try:
            return await self.provider.call(build)
        except NotReadyError as err:
            raise LookupError("no workspace") from err
