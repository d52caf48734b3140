"""`RemoteBackend`: the server core's `Backend` over an OpenAI-compatible engine server.

Prompts are laid out locally, with the model's own tokenizer, exactly as for the local
engine (same segments, same order), and sent as text; the server's prefix cache then
reuses whatever leading bytes the previous request shared. What the server reused
comes back in the usage it reports (`openai_stream.parse_event`); a request's metrics
say prompt / cached / recomputed tokens and TTFT as the local engine's do.

One worker thread sends requests one at a time, most urgent first (`Priority`, FIFO
within one): an interactive request that arrives while a PREPARE or warm-up request
streams closes that stream (it ends "cancelled", as a preempted local request does,
and its caller may send it again). A request with `max_tokens` 0 (a prefill, e.g.
warm-up) is sent with one token and its text dropped: that is what puts its prompt in
the server's cache. Batches run one by one. The loop guard (`generation.loopGuard`) reads
the streamed text (`TextLoopGuard`: the text tokenized here) and closes a stream that loops:
it ends "repetition" as a local answer does. The repetition penalty is the local engine's
only; servers also stop on `stop` strings and `max_tokens`. A server that
cannot be reached fails each request with a clear error; background requests (warm-up,
hover preparation) then wait 1, 2, 4 … up to 30 s between attempts, interactive ones
always try, and the first answer resets it (`stats()["reachable"]`).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any, Awaitable, Callable, Iterable, Sequence

from engine.handle import RequestHandle
from engine.loop_guard import LoopGuard, TextLoopGuard
from engine.request import DoneEvent, Metrics, Priority, Probe, Request, SegmentLike, TokenEvent

from ..handles import until_done
from ..settings import GenerationSettings, WindowSettings
from .openai_stream import CompletionStream, Endpoint, RemoteEngineError, UnreachableError, Usage

logger = logging.getLogger(__name__)
MAX_BACKOFF_S = 30.0
"""Longest wait between background attempts to reach a server that did not answer."""


class RemoteBackend:
    """`Backend` over the engine server at `endpoint`.

    Args:
        endpoint: Where the server is (and its key).
        tokenizer: The model's tokenizer (the local model directory's).
        model_id: The local model's id (shown in status).
        served_model: The `model` field sent with each request.
        context_length: The model's context window.
    """

    def __init__(self, endpoint: Endpoint, tokenizer: Any, model_id: str, served_model: str,
                 context_length: int) -> None:
        self.endpoint = endpoint
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.served_model = served_model
        self.context_length = context_length
        self.generation = GenerationSettings()
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, Request, RequestHandle]] = []
        self._order = itertools.count()
        self._current: tuple[Request, CompletionStream | None] | None = None
        self._cancelled: set[str] = set()
        self._closed = False
        # The engine's own counter names (`Engine.stats`): status pages and /metrics read them alike.
        self._counters = {"requests_served": 0, "requests_cancelled": 0, "requests_failed": 0,
                          "prompt_tokens": 0, "cached_tokens": 0, "decode_tokens": 0}
        self._last_error: str | None = None
        self._failures = 0  # connection failures in a row
        self._retry_at = 0.0  # background requests are not sent before this (monotonic seconds)
        self.tokenizer_check = "not checked"  # set by `start_remote_backend`
        self._last_prompt: tuple[int, ...] = ()  # token ids of the last prompt the server answered
        self._worker = threading.Thread(target=self._work, name="codectx-remote", daemon=True)
        self._worker.start()

    # -- Backend --------------------------------------------------------------------------------

    def submit(self, request: Request, on_progress: Callable[[int, int], None] | None = None) -> RequestHandle:
        handle = RequestHandle(request, self.cancel)
        with self._cond:
            if self._closed:
                raise RemoteEngineError("the remote backend is closed")
            heapq.heappush(self._queue, (int(request.priority), next(self._order), request, handle))
            running = self._current
            if running is not None and request.priority < running[0].priority:
                self._stop(running[1])  # more urgent work waits: the running request ends "cancelled"
            self._cond.notify_all()
        return handle

    async def generate(self, request: Request, *, on_text: Callable[[str], None] | None = None,
                       on_prefill: Callable[[int, int], None] | None = None) -> DoneEvent:
        return await until_done(self, self.submit(request), request.request_id, on_text)

    def generate_batch(self, requests: Sequence[Request]) -> list[Awaitable[DoneEvent]]:
        return [until_done(self, self.submit(r), r.request_id) for r in requests]

    def cancel(self, request_id: str) -> None:
        """Stop a queued or running request, counted now: a status read after the editor's cancel
        has its answer sees it, though the worker may still be leaving the stream."""
        with self._cond:
            running = self._current
            if running is not None and running[0].request_id == request_id:
                self._stop(running[1])
            elif request_id not in self._cancelled and any(queued[2].request_id == request_id
                                                           for queued in self._queue):  # once: a second cancel
                self._cancelled.add(request_id)
                self._counters["requests_cancelled"] += 1
            self._cond.notify_all()

    def _stop(self, stream: CompletionStream | None) -> None:
        """Close the running request's stream (it ends "cancelled") and count it, once; under `_cond`."""
        if stream is not None and not stream.closed:
            stream.close()
            self._counters["requests_cancelled"] += 1

    def probe(self, segments: Sequence[SegmentLike]) -> Probe:
        """What the server most likely holds: the leading tokens `segments` share with the last
        prompt it answered. The server does not say what its cache holds (another client may
        have replaced it since); what it reused is known only afterwards, from its usage."""
        warm = shared_tokens(self._last_prompt, itertools.chain.from_iterable(s.token_ids for s in segments))
        total = whole = 0
        for segment in segments:  # the segments the shared tokens hold whole
            total += len(segment.token_ids)
            if total > warm:
                break
            whole += 1
        prompt = sum(len(s.token_ids) for s in segments)
        return Probe(prompt_tokens=prompt, warm_tokens=warm, warm_segments=whole,
                     miss=None if warm == prompt else "remote engine: not the last prompt it answered")

    def warm_prefix(self) -> Sequence[SegmentLike]:
        return ()

    def stats(self) -> dict:
        with self._cond:
            queued = len(self._queue)
            running = self._current[0].request_id if self._current else None
        retry_in = max(0.0, self._retry_at - time.monotonic())
        return {"engine": "remote", "url": self.endpoint.base_url, "model": self.served_model,
                "model_id": self.model_id, "tokenizer": self.tokenizer_check, "reachable": self._failures == 0,
                "retry_in_s": round(retry_in, 1) if self._failures else None, "queued": queued,
                "running": running, "closed": self._closed, "last_error": self._last_error,
                "compute": {"kind": "remote"}, "archive": None, **self._counters,
                # What the server most likely holds (`probe`): the last prompt it answered.
                "cache": {"live_tokens": len(self._last_prompt)}}

    def unreachable(self, error: str) -> None:
        """Records a failed attempt to reach the server: background requests back off (1, 2, 4 …
        30 s) while interactive ones still try."""
        self._failures += 1
        self._retry_at = time.monotonic() + min(MAX_BACKOFF_S, 2.0 ** (self._failures - 1))
        self._last_error = error

    def archive_problem(self) -> str | None:
        return None

    def set_window(self, window: WindowSettings) -> None:
        """The server's attention is its own: nothing to change here."""

    def set_generation(self, generation: GenerationSettings) -> None:
        """The loop guard applies from the next request on; the repetition penalty is the local engine's only."""
        self.generation = generation

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.tokenizer.encode(self.tokenizer.render_chat(messages, add_generation_prompt=True))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._queue = self._queue, []
            running = self._current
            if running is not None and running[1] is not None:
                running[1].close()
            self._cond.notify_all()
        for _, _, request, handle in pending:
            handle.push(DoneEvent(request.request_id, "cancelled", "", Metrics()))
        self._worker.join(timeout=10)

    # -- the worker -----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                _, _, request, handle = heapq.heappop(self._queue)
                if request.request_id in self._cancelled:
                    self._cancelled.discard(request.request_id)
                    handle.push(DoneEvent(request.request_id, "cancelled", "", Metrics()))
                    continue
                if request.priority != Priority.INTERACTIVE and time.monotonic() < self._retry_at:
                    handle.push(DoneEvent(request.request_id, "error", "", Metrics(), RemoteEngineError(
                        f"{self._last_error} (background requests wait {self._retry_at - time.monotonic():.0f} s "
                        "more before the next try)")))
                    continue
                stream = CompletionStream(self.endpoint, self._body(request))
                self._current = (request, stream)
            try:
                done = self._run(request, handle, stream)
            finally:
                with self._cond:
                    self._current = None
                    self._cancelled.discard(request.request_id)
            handle.push(done)

    def _body(self, request: Request) -> dict:
        body = {"prompt": self.tokenizer.decode(request.all_token_ids()), "max_tokens": max(1, request.max_tokens),
                "temperature": request.sampling.temperature, "top_p": request.sampling.top_p}
        if self.served_model:
            body["model"] = self.served_model
        if request.stop:
            body["stop"] = list(request.stop)
        if request.sampling.seed is not None:
            body["seed"] = request.sampling.seed
        return body

    def _run(self, request: Request, handle: RequestHandle, stream: CompletionStream) -> DoneEvent:
        """Streams one request; its `DoneEvent` (never raises)."""
        started = time.perf_counter()
        metrics = Metrics(prompt_tokens=len(request.all_token_ids()))
        texts: list[str] = []
        finish, usage = None, Usage()
        guard = self._loop_guard(request, metrics)
        events = iter(stream)
        try:
            for chunk in events:
                if chunk.usage is not None:
                    usage = chunk.usage
                if chunk.text and request.max_tokens > 0:
                    if not texts:
                        metrics.ttft_s = metrics.prefill_s = time.perf_counter() - started
                    texts.append(chunk.text)
                    handle.push(TokenEvent(request.request_id, chunk.text, ()))
                    if guard is not None and guard.feed(chunk.text):
                        with self._cond:  # the answer is over: a cancel from here on finds it finished
                            self._current = (request, None)
                        break
                finish = chunk.finish_reason or finish
        except RemoteEngineError as err:
            self._counters["requests_failed"] += 1
            if isinstance(err, UnreachableError):
                self.unreachable(str(err))
            else:
                self._last_error = str(err)
            logger.warning("remote engine: %s", err)
            return DoneEvent(request.request_id, "error", "".join(texts), metrics, err)
        finally:
            events.close()  # after a loop: the connection is shut, the server sees the client leave and stops
        with self._cond:  # a cancel from here on finds the request finished, and counts nothing
            closed, self._current = stream.closed, (request, None)
        if closed:  # counted where it was closed (`_stop`)
            return DoneEvent(request.request_id, "cancelled", "".join(texts), metrics)
        looped = guard is not None and (guard.guard.fired or guard.finish())
        if looped and usage.completion_tokens is None:  # left before the server's usage: what is known here
            usage = Usage(None, shared_tokens(self._last_prompt, request.all_token_ids()), guard.tokens)
        self._last_error, self._failures, self._retry_at = None, 0, 0.0
        self._last_prompt = tuple(request.all_token_ids())
        self._account(request, metrics, usage, started, texts)
        reason = "length" if request.max_tokens == 0 or finish == "length" else "stop"
        return DoneEvent(request.request_id, "repetition" if looped else reason, "".join(texts), metrics)

    def _loop_guard(self, request: Request, metrics: Metrics) -> TextLoopGuard | None:
        """The guard over the answer's text (`generation.loopGuard`), None when off or nothing is generated."""
        if not self.generation.loop_guard or request.max_tokens <= 0:
            return None
        tokenizer = self.tokenizer
        return TextLoopGuard(LoopGuard(True, metrics, tokenizer.loop_keys), tokenizer.encode, tokenizer.decode)

    def _account(self, request: Request, metrics: Metrics, usage: Usage, started: float, texts: list[str]) -> None:
        if usage.prompt_tokens is not None:
            metrics.prompt_tokens = usage.prompt_tokens  # the server's own count of the prompt it read
        metrics.cached_tokens = usage.cached_tokens or 0
        metrics.recomputed_tokens = max(0, metrics.prompt_tokens - metrics.cached_tokens)
        metrics.decode_tokens = 0 if request.max_tokens == 0 else (usage.completion_tokens or len(texts))
        metrics.decode_s = time.perf_counter() - started - metrics.ttft_s if texts else 0.0
        counters = self._counters
        counters["requests_served"] += 1
        counters["prompt_tokens"] += metrics.recomputed_tokens  # as the engine counts: tokens prefilled
        counters["cached_tokens"] += metrics.cached_tokens
        counters["decode_tokens"] += metrics.decode_tokens


def shared_tokens(last: Sequence[int], ids: Iterable[int]) -> int:
    """How many leading tokens `ids` shares with `last` (read no further than the first difference)."""
    shared = 0
    for held, token in zip(last, ids):
        if held != token:
            break
        shared += 1
    return shared
