"""Where the HTTP side gets its engine: the editor's, or one of its own.

`EngineSource` is what the app needs: the engine that is up (or None while
loading), the names it answers to, and the repository prompt for the
`codectx` model. `LspSource` reads the language server's `Session` in the
same process (one engine, one set of checkpoints) and builds repository
prompts on the language server's event loop, where the workspace lives.
`StandaloneSource` owns an engine started with the language server's own
`start_backend`, for `codectx serve --http` without an editor.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from engine.request import Priority, PromptSegment, Request

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT_LENGTH = 8192


@dataclass(frozen=True)
class Served:
    """The engine that is up and what it answers to.

    Attributes:
        engine: The `engine.engine.Engine`.
        tokenizer: Its `engine.tokenizer.Tokenizer`.
        model_id: The loaded model's id (listed by /v1/models).
        aliases: Other names accepted for the plain model (the configured name).
        context_length: The model's context window in tokens.
        has_repository: True when the `codectx` repository model is available.
    """

    engine: Any
    tokenizer: Any
    model_id: str
    aliases: tuple[str, ...] = ()
    context_length: int = DEFAULT_CONTEXT_LENGTH
    has_repository: bool = False


class EngineSource(Protocol):
    """What the HTTP app reads its engine and repository prompt from."""

    def current(self) -> Served | None:
        """The engine that is up, or None while the model loads."""

    async def repository_segments(self, turns: Sequence[tuple[str, str]]) -> list[PromptSegment]:
        """The workspace prompt with these (role, content) turns; the last is the question."""


def _context_length(engine: Any) -> int:
    return int(getattr(engine.loaded, "context_length", 0) or DEFAULT_CONTEXT_LENGTH)


def _turns(turns: Sequence[tuple[str, str]]) -> list[Any]:
    from server.core.prompt import Turn

    return [Turn(role, content) for role, content in turns]


class StandaloneSource:
    """An engine of its own, plus an optional workspace for the repository model.

    Args:
        backend: A `server.core.backend.Backend` (engine, tokenizer, model id).
        name: The name the model was asked for (accepted as an alias).
        prompt: A `WorkspacePrompt`, or None.
    """

    def __init__(self, backend: Any, name: str = "", prompt: Any = None) -> None:
        self.backend = backend
        self.prompt = prompt
        aliases = tuple(a for a in {name, Path(name).name} if a and a != backend.model_id)
        self._served = Served(backend.engine, backend.tokenizer, backend.model_id, aliases,
                              _context_length(backend.engine), prompt is not None)

    @classmethod
    def start(cls, model: str, *, workspace: Path | None = None, settings: Any = None) -> StandaloneSource:
        """Load `model` (blocking) with the language server's settings and engine construction.

        Raises:
            ModelNotFoundError, ModelLoadError: As `start_backend`.
            ContextError: The workspace cannot be scanned.
        """
        import dataclasses

        from server.core.backend import start_backend
        from server.core.settings import Settings

        settings = settings or Settings()
        settings = dataclasses.replace(settings, model=dataclasses.replace(settings.model, name=model))
        backend = start_backend(settings)
        prompt = build_workspace_prompt(workspace, backend.tokenizer, settings) if workspace else None
        source = cls(backend, model, prompt)
        if prompt is not None:
            source.warm()
        return source

    def current(self) -> Served:
        return self._served

    async def repository_segments(self, turns: Sequence[tuple[str, str]]) -> list[PromptSegment]:
        if self.prompt is None:
            raise LookupError("no workspace")
        return self.prompt.segments(_turns(turns))

    def warm(self) -> None:
        """Prefill the workspace prefix in the background (interactive requests go first)."""
        segments = self.prompt.prefix_segments()
        if segments:
            self.backend.engine.submit(Request(segments=segments, max_tokens=0, priority=Priority.BACKGROUND))

    def close(self) -> None:
        self.backend.engine.close()


def build_workspace_prompt(root: Path, tokenizer: Any, settings: Any) -> Any:
    """The language server's prompt for `root` (`WorkspacePrompt`: one builder, one access policy)."""
    from server.core.tools import TOOLS_PROMPT
    from server.core.prompt import WorkspacePrompt

    def no_buffers(path: Path) -> None:
        return None

    return WorkspacePrompt(root, tokenizer, no_buffers, TOOLS_PROMPT, settings.context)


class LspSource:
    """The language server's engine in the same process.

    Args:
        server: The `server.lsp.app.CodectxServer` (its `session` is read on each call,
            since `initialize` replaces it).
    """

    def __init__(self, server: Any) -> None:
        self.server = server

    def current(self) -> Served | None:
        session = self.server.session
        engine = session.engine
        if engine is None or session.tokenizer is None or not session.model_id:
            return None
        name = session.settings.model.name
        aliases = tuple(a for a in {name, Path(name).name} if a and a != session.model_id)
        return Served(engine, session.tokenizer, session.model_id, aliases, _context_length(engine),
                      session.prompt is not None)

    async def repository_segments(self, turns: Sequence[tuple[str, str]]) -> list[PromptSegment]:
        task = self.server.start_up_task
        if task is None:
            raise LookupError("no workspace")
        lsp_loop = task.get_loop()

        async def build() -> list[PromptSegment]:
            prompt = self.server.session.prompt
            if prompt is None:
                raise LookupError("no workspace")
            return prompt.segments(_turns(turns))

        # The workspace belongs to the language server's loop: build the prompt there.
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(build(), lsp_loop))
