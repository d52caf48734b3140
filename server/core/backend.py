"""The Backend features and transports run the model through, and `start_backend`.

`Backend` is the interface: submit or generate a request (or a batch sharing a prefix), cancel it, probe how
much of a prompt is warm (and which prefix it last prefilled), read counters.
`EngineBackend` implements it over the local `engine.Engine`; another
implementation (a remote engine) slots in beside it. `start_backend` is the one place an engine is built, for the language
server, the HTTP API and every CLI command. MLX is imported lazily, inside it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Awaitable, Callable, Protocol, Sequence

from engine.request import DoneEvent, Probe, Request, SegmentLike

from .handles import until_done
from .settings import GenerationSettings, Settings, WindowSettings

logger = logging.getLogger(__name__)
DEFAULT_CONTEXT_LENGTH = 8192


__all__ = ["Backend", "EngineBackend", "Probe", "start_backend", "window_policy"]


class Backend(Protocol):
    """What runs the model, as features and transports see it.

    Attributes:
        model_id: The loaded model's id.
        tokenizer: The tokenizer prompts are built with.
        context_length: The model's context window in tokens.
    """

    model_id: str
    tokenizer: Any
    context_length: int

    def submit(self, request: Request, on_progress: Callable[[int, int], None] | None = None) -> Any:
        """Queues `request`; returns its handle (a sync and async iterator of events ending
        with one `DoneEvent`, with `cancel()`, `done` and `result()`)."""

    async def generate(self, request: Request, *, on_text: Callable[[str], None] | None = None,
                       on_prefill: Callable[[int, int], None] | None = None) -> DoneEvent:
        """Runs `request` to its `DoneEvent` (whatever its finish reason)."""

    def generate_batch(self, requests: Sequence[Request]) -> list[Awaitable[DoneEvent]]:
        """Runs requests whose prompts share leading segments together where the backend can (the
        engine's NumPy forward, greedy sampling), else one by one; one awaitable `DoneEvent` per
        request, each done as soon as its own answer ends. Await each (or wrap it in a task);
        cancelling one cancels its request only."""

    def cancel(self, request_id: str) -> None:
        """Stops a queued or running request (unknown ids are ignored)."""

    def probe(self, segments: Sequence[SegmentLike]) -> Probe:
        """How much of `segments` the backend could restore now, and why not more (cheap:
        no model work, callable per hover)."""

    def warm_prefix(self) -> Sequence[SegmentLike]:
        """The repository prefix (leading stable segments) the backend last prefilled, while it
        still holds all of it; empty otherwise."""

    def stats(self) -> dict:
        """Counters for status pages and metrics (shown, never interpreted)."""

    def archive_problem(self) -> str | None:
        """Why the disk archive is off ("off: <reason>"), or None when it is on or not asked for."""

    def set_window(self, window: WindowSettings) -> None:
        """Uses these window settings from the next request on."""

    def set_generation(self, generation: GenerationSettings) -> None:
        """Uses these generation settings (loop guard, repetition penalty) from the next request on."""

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of plain chat `messages` (no repository), generation prompt added."""

    def close(self) -> None:
        """Stops the backend; running requests end "cancelled"."""


class EngineBackend:
    """`Backend` over an in-process `engine.Engine`.

    Every request it submits gets the `generation.*` settings (loop guard, repetition
    penalty) in its sampling parameters, whoever built it: ask, hover, code actions, HTTP.

    Args:
        engine: The started engine (or a stand-in with its `submit`/`cancel`/`stats`/`close`).
        tokenizer: Its tokenizer.
        model_id: The loaded model's id.
        context_length: The model's context window (default: the engine's loaded model's).
        generation: The generation settings (default: the settings' defaults).
    """

    def __init__(self, engine: Any, tokenizer: Any, model_id: str, context_length: int | None = None,
                 generation: GenerationSettings | None = None) -> None:
        self.engine = engine
        self.generation = generation or GenerationSettings()
        self.tokenizer = tokenizer
        self.model_id = model_id
        loaded = getattr(engine, "loaded", None)
        self.context_length = context_length or int(getattr(loaded, "context_length", 0) or DEFAULT_CONTEXT_LENGTH)

    def submit(self, request: Request, on_progress: Callable[[int, int], None] | None = None) -> Any:
        return self.engine.submit(self._with_generation(request), on_progress=on_progress)

    def _with_generation(self, request: Request) -> Request:
        generation = self.generation
        sampling = dataclasses.replace(request.sampling, loop_guard=generation.loop_guard,
                                       repetition_penalty=generation.repetition_penalty)
        return dataclasses.replace(request, sampling=sampling)

    async def generate(self, request: Request, *, on_text: Callable[[str], None] | None = None,
                       on_prefill: Callable[[int, int], None] | None = None) -> DoneEvent:
        """Runs `request`, streaming text to `on_text` and prefill progress to `on_prefill`
        (both on the event loop). Cancelling the awaiting task cancels the request (it rolls
        back to its last confirmed checkpoint) and re-raises CancelledError."""
        loop = asyncio.get_running_loop()
        chunk_callback = None
        if on_prefill is not None:
            def chunk_callback(done: int, total: int) -> None:  # worker thread
                loop.call_soon_threadsafe(on_prefill, done, total)
        return await until_done(self, self.submit(request, on_progress=chunk_callback), request.request_id, on_text)

    def generate_batch(self, requests: Sequence[Request]) -> list[Awaitable[DoneEvent]]:
        requests = [self._with_generation(r) for r in requests]
        submit_batch = getattr(self.engine, "submit_batch", None)  # a stand-in engine may have none
        handles = submit_batch(requests) if submit_batch is not None else [self.engine.submit(r) for r in requests]
        return [until_done(self, handle, request.request_id) for request, handle in zip(requests, handles)]

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)

    def probe(self, segments: Sequence[SegmentLike]) -> Probe:
        return self.engine.probe(segments)

    def warm_prefix(self) -> Sequence[SegmentLike]:
        return self.engine.warm_prefix()

    def stats(self) -> dict:
        return self.engine.stats()

    def archive_problem(self) -> str | None:
        archive = self.engine.stats().get("archive")
        return archive if archive and archive.startswith("off") else None

    def set_window(self, window: WindowSettings) -> None:
        self.engine.set_window(window_policy(window))

    def set_generation(self, generation: GenerationSettings) -> None:
        self.generation = generation

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.engine.chat_ids(messages)

    def close(self) -> None:
        self.engine.close()


def start_backend(settings: Settings, *, progress: bool = False) -> Backend:
    """Loads `settings.model.name` and starts an `Engine` on it (blocking), with the
    disk archive as `settings.memory` says; with `engine.url`, a `RemoteBackend` on that
    server instead (the local model directory gives only the tokenizer).

    Args:
        settings: The settings tree (model, compute, window, memory). `compute.blas*` are
            applied here, once per process, before MLX is imported (`engine.blas.preload`).
        progress: Show download/conversion progress bars on stderr.

    Raises:
        ModelNotFoundError: The model name resolves to nothing.
        ModelLoadError: The model exists but cannot be loaded.
    """
    if settings.engine.url:
        from .remote.start import start_remote_backend

        return start_remote_backend(settings)
    from engine import blas

    compute = settings.compute  # the engine's own ComputeOptions
    blas.preload(compute.blas, compute.blas_threads)  # the start-up step, before MLX is imported
    from engine.draft_model import drafter_for
    from engine.engine import Engine
    from engine.loading import load_model

    loaded = load_model(settings.model.name, progress=progress, gguf_bits=settings.model.gguf_bits)
    memory = settings.memory
    draft = drafter_for(settings.model.draft_model, settings.model.speculation, loaded.tokenizer, compute,
                        memory.checkpoint_bytes)
    engine = Engine(loaded, kv_bits=settings.model.kv_bits, prefill_chunk=settings.model.prefill_chunk,
                    checkpoint_budget_bytes=memory.checkpoint_bytes,
                    archive_bytes=memory.archive_bytes if memory.archive_enabled else 0,
                    speculation=settings.model.speculation, window=window_policy(settings.window),
                    draft=draft, compute=compute)
    logger.info("engine started on %s", loaded.model_id)
    return EngineBackend(engine, loaded.tokenizer, loaded.model_id, getattr(loaded, "context_length", None),
                         settings.generation)


def window_policy(window: WindowSettings) -> Any:
    """The engine's `WindowPolicy` for the `window.*` settings (disabled: exact attention)."""
    from engine.window import WindowPolicy

    return WindowPolicy(enabled=window.enabled, global_tokens=window.global_tokens,
                        window_tokens=window.window_tokens, dense_tail=window.dense_tail_tokens,
                        continuation_tail=window.continuation_tail_tokens)
