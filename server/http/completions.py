"""`/v1/chat/completions` and `/v1/models`: OpenAI-compatible generation on the shared engine."""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.request import DoneEvent, PromptSegment, Request, TokenEvent
from server.core.question import EmptyQuestionError, check_question

from . import openai_format as fmt
from .activity import Activity
from .body import parse_json_object, read_body, require_json_content_type
from .chat_prompt import REPOSITORY_MODEL, message_segments, repository_turns
from .chat_request import ChatParams, parse_chat_request
from .config import HttpConfig
from .errors import (BadRequestError, ContextLengthError, ModelNotFoundError, NotReadyError, error_body,
                     to_http_error)
from .generation import Generation, result_unless_disconnected
from .prompt_limits import Workers, check_text_fits
from .source import EngineSource, Served
from .tool_calls import ToolCallStream, split_tool_calls


class EventStreamResponse(StreamingResponse):
    """Server-sent events that cancel their generation however the response ends."""

    def __init__(self, content: AsyncIterator[bytes], generation: Generation) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # a client disconnect lands here too: stop the engine work
            self.generation.cancel()


class ChatService:
    """Turns chat requests into engine requests.

    Args:
        source: Where the engine comes from.
        config: Limits.
        activity: What the monitor shows.
    """

    def __init__(self, source: EngineSource, config: HttpConfig, activity: Activity) -> None:
        self.source = source
        self.config = config
        self.activity = activity
        self.started = int(time.time())
        self.workers = Workers(config.prompt_workers)

    def served(self) -> Served:
        served = self.source.current()
        if served is None:
            raise NotReadyError("the model is still loading; try again in a moment", code="model_loading")
        return served

    async def models(self, request: HttpRequest) -> Response:
        served = self.served()
        ids = [served.model_id] + ([REPOSITORY_MODEL] if served.has_repository else [])
        return JSONResponse(fmt.model_list(ids, self.started))

    async def chat_completions(self, request: HttpRequest) -> Response:
        try:
            require_json_content_type(request)
            raw = await read_body(request, self.config.max_body_bytes)
            params = await self.workers.run(_parse, raw)
            served = self.served()
            segments = await self._segments(served, params)
            max_tokens = self._check_length(served, segments, params)
        except Exception as err:
            if 400 <= to_http_error(err).status < 500:
                self.activity.totals.rejected += 1
            raise
        generation = self._submit(served, params, segments, max_tokens)
        if params.stream:
            return EventStreamResponse(self._stream(generation, params), generation)
        done = await result_unless_disconnected(generation, request.receive)
        if done.finish_reason == "error":
            http = to_http_error(done.error)
            return JSONResponse(error_body(http), status_code=http.status)
        text, calls = split_tool_calls(done.text) if params.tools else (done.text, [])
        return JSONResponse(fmt.completion(generation.tracked.request_id, params.model, text,
                                           done.finish_reason, done.metrics, calls))

    async def _segments(self, served: Served, params: ChatParams) -> list[PromptSegment]:
        """The prompt, built on a worker thread once its size says it may fit."""
        texts = [m["content"] for m in params.messages]
        if params.model == REPOSITORY_MODEL:
            if not served.has_repository:
                raise ModelNotFoundError(f"model '{REPOSITORY_MODEL}' needs a workspace (start with --workspace "
                                         "or alongside the editor)", param="model", code="model_not_found")
            await self.workers.run(check_text_fits, served.tokenizer, texts, self._limit(served))
            return await self.source.repository_segments(repository_turns(params.messages, params.tools))
        if params.model not in (served.model_id, *served.aliases):
            names = ", ".join([served.model_id] + ([REPOSITORY_MODEL] if served.has_repository else []))
            raise ModelNotFoundError(f"model '{params.model[:80]}' is not served here (available: {names})",
                                     param="model", code="model_not_found")

        def build() -> list[PromptSegment]:
            check_text_fits(served.tokenizer, texts, self._limit(served))
            return message_segments(served.tokenizer, params.messages, tools=params.tools,
                                    template_kwargs=params.template_kwargs)

        return await self.workers.run(build)

    def _limit(self, served: Served) -> int:
        return min(self.config.max_prompt_tokens or served.context_length, served.context_length)

    def _check_length(self, served: Served, segments: list[PromptSegment], params: ChatParams) -> int:
        """The max_tokens to use; raises `ContextLengthError` for an oversize prompt."""
        prompt_tokens = sum(len(s.token_ids) for s in segments)
        limit = self._limit(served)
        if prompt_tokens >= limit:
            raise ContextLengthError(f"the prompt has {prompt_tokens} tokens; this server accepts fewer than "
                                     f"{limit}")
        return min(params.max_tokens, served.context_length - prompt_tokens)

    def _submit(self, served: Served, params: ChatParams, segments: list[PromptSegment],
                max_tokens: int) -> Generation:
        preview = next((m["content"] for m in reversed(params.messages) if m["role"] == "user"), "")
        prompt_tokens = sum(len(s.token_ids) for s in segments)
        tracked = self.activity.start(params.model, preview, prompt_tokens, params.stream)
        loop = asyncio.get_running_loop()

        def on_progress(done: int, total: int) -> None:  # engine worker thread
            loop.call_soon_threadsafe(tracked.on_prefill, done, total)

        request = Request(segments=segments, max_tokens=max_tokens, sampling=params.sampling, stop=params.stop,
                          request_id=tracked.request_id)
        try:
            handle = served.backend.submit(request, on_progress=on_progress)
        except Exception:
            self.activity.active.pop(tracked.request_id, None)
            raise
        return Generation(handle, tracked, self.activity)

    async def _stream(self, generation: Generation, params: ChatParams) -> AsyncIterator[bytes]:
        request_id, created = generation.tracked.request_id, int(time.time())

        def content(text: str) -> bytes:
            return fmt.sse(fmt.chunk(request_id, params.model, created, delta={"content": text}))

        calls_stream = ToolCallStream() if params.tools else None
        yield fmt.sse(fmt.chunk(request_id, params.model, created, delta={"role": "assistant", "content": ""}))
        async for event in generation.events():
            if isinstance(event, TokenEvent):
                text = calls_stream.push(event.text) if calls_stream else event.text
                if text:
                    yield content(text)
                continue
            calls: list[dict] = []
            if calls_stream is not None:
                rest, calls = calls_stream.finish()
                if rest:
                    yield content(rest)
            if calls:
                yield fmt.sse(fmt.chunk(request_id, params.model, created, delta={"tool_calls": calls}))
            yield from_done(event, request_id, params, created, "tool_calls" if calls else None)
            if params.include_usage:
                yield fmt.sse(fmt.chunk(request_id, params.model, created, metrics=event.metrics))
        yield fmt.sse("[DONE]")


def _parse(raw: bytes) -> ChatParams:
    """The body parsed and validated (CPU work: runs on a worker thread); the last user
    message goes through the core's question check."""
    params = parse_chat_request(parse_json_object(raw))
    users = [i for i, m in enumerate(params.messages) if m["role"] == "user"]
    if users:
        try:
            check_question(params.messages[users[-1]]["content"])
        except EmptyQuestionError as err:
            raise BadRequestError(str(err), param=f"messages[{users[-1]}].content",
                                  code="empty_question") from err
    return params


def from_done(done: DoneEvent, request_id: str, params: ChatParams, created: int,
              finish_reason: str | None = None) -> bytes:
    """The stream's closing chunk (or an error event when generation failed)."""
    if done.finish_reason == "error":
        return fmt.sse(error_body(to_http_error(done.error)))
    return fmt.sse(fmt.chunk(request_id, params.model, created, finish_reason=finish_reason or done.finish_reason))

