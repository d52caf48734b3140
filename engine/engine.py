"""`Engine`: one worker thread that owns MLX and serves requests in priority order.

    engine = Engine(load_model(path))
    events = list(engine.submit(Request(prompt_ids=ids, max_tokens=64)))  # TokenEvent..., then DoneEvent
    engine.close()

Requests run one at a time, lowest `Request.priority` first, FIFO within a priority (answers that
share a prefix may run as one batch job: `submit_batch`, `engine.batch`). A request still in prefill
yields to a higher-priority arrival at the next chunk boundary: it rolls back to its last checkpoint and
is queued again in its old place (a PREPARE request yields while decoding too, ending "cancelled"; see
`Priority`). `cancel` is safe from any thread at any time; the worker checks it between prefill chunks
and between decode steps.

One live cache serves every request: `PrefixCache` restores the longest valid checkpoint, prefills the
rest and rolls back to confirmed state after a cancel or an error.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Iterator, Sequence

import mlx.core as mx

from .answer_stream import AnswerStream
from .batch import submit_batch
from .compute import choose
from .compute_options import ComputeOptions
from .errors import ContextOverflowError, EngineClosedError, RequestCancelled
from .generate import DEFAULT_PREFILL_CHUNK, ChunkCallback, decode
from .handle import RequestHandle
from .jobs import Job, JobQueue
from .kv import SUPPORTED_KV_BITS
from .live_cache import policy_and_cache
from .prefix_cache import PrefixCache
from .request import DoneEvent, Metrics, Priority, Probe, Request, SamplingParams, SegmentLike
from .sampling import RepetitionPenalty, make_sampler
from .speculative import Mode
from .speculative_decode import speculative_decode

logger = logging.getLogger(__name__)

class Engine:
    """Serves generation requests for one loaded model.

    Args:
        loaded: A `LoadedModel` from `engine.loading.load_model` (its `model`, `tokenizer`, `model_id`).
        kv_bits: 16 (model dtype) or 8 (quantized KV, group 64, from token 0).
        prefill_chunk: Tokens per prefill forward call.
        checkpoint_budget_bytes: Bytes checkpoints may own (None: 1/8 of memory).
        archive_bytes: Size cap of the disk archive under ``CODECTX_HOME`` (0, the default: memory only).
        speculation: Decode mode: "off", "lookup" (prompt lookup), "draft" (needs `draft`) or "auto" (speculates
            while it pays off); greedy output is the same in every mode (engine.speculative).
        draft: A `engine.draft_model.DraftModelDrafter` for "draft"/"auto"
            (`engine.draft_model.drafter_for` builds one from a model name).
        window: An `engine.window.WindowPolicy` for windowed prefill (`approximation.enabled`); None or a disabled
            policy gives exact attention, and so does a window with G + W >= the model's context. Which positions
            are windowed follows each request's segment layout; the policy is part of the checkpoint fingerprint.
        compute: How the forward is computed (`engine.compute.choose` resolves it once, here); the resolved path
            is part of the checkpoint fingerprint.

    Raises:
        ValueError: For unsupported `kv_bits`, `prefill_chunk` < 1, or speculation "draft" without a draft model.
    """

    def __init__(self, loaded: Any, *, kv_bits: int = 16, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 checkpoint_budget_bytes: int | None = None, archive_bytes: int = 0,
                 speculation: str = "off", draft: Any = None, window: Any = None,
                 compute: ComputeOptions = ComputeOptions()) -> None:
        if kv_bits not in SUPPORTED_KV_BITS:
            raise ValueError(f"kv_bits must be one of {SUPPORTED_KV_BITS}, got {kv_bits}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.loaded = loaded
        self.model = loaded.model
        self.compute = choose(self.model, compute)
        self.tokenizer = loaded.tokenizer
        self.kv_bits = kv_bits
        self.prefill_chunk = prefill_chunk
        self.speculation = Mode(speculation)  # ValueError names the modes
        if self.speculation is Mode.DRAFT and draft is None:
            raise ValueError("speculation 'draft' needs a draft model")
        self.draft = draft
        self._eos = frozenset(self.tokenizer.eos_token_ids)
        self.window = window
        policy, cache = policy_and_cache(loaded, self.compute, kv_bits, prefill_chunk, window)
        self.prefix = PrefixCache(
            self.compute, policy, budget_bytes=checkpoint_budget_bytes, archive_bytes=archive_bytes, cache=cache,
            window=window if policy.approximation else None,
            rebuild=lambda: policy_and_cache(loaded, self.compute, kv_bits, prefill_chunk, self.window)[1],
            room_limit=getattr(loaded, "context_length", None) or None)  # (0: not known, as check_fits reads it)
        self._pending_window: tuple[Any] | None = None
        self._queue = JobQueue()
        self._lock = threading.Lock()
        self._active: dict[str, Job] = {}
        self._running: str | None = None
        self._closed = False
        self._counts = {"served": 0, "cancelled": 0, "failed": 0, "prompt_tokens": 0, "decode_tokens": 0}
        self._worker = threading.Thread(target=self._work, name="codectx-engine", daemon=True)
        self._worker.start()

    # -- public API -------------------------------------------------------

    def submit(self, request: Request, *, on_progress: ChunkCallback | None = None) -> RequestHandle:
        """Queue a request and return its handle (a sync and async iterator of events).

        Args:
            request: What to generate.
            on_progress: Called on the worker thread after each prefill chunk with (prompt tokens done,
                prompt tokens total); keep it short.

        Raises:
            EngineClosedError: After `close()`.
            ValueError: When the request id is already in flight.
            ContextOverflowError: When the prompt and `max_tokens` do not fit the model's context.
        """
        self.check_fits(request)
        handle = RequestHandle(request, self.cancel)
        with self._lock:
            if self._closed:
                raise EngineClosedError("engine is closed")
            if request.request_id in self._active:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            job = self._queue.new_job(request, handle, on_progress)
            self._active[request.request_id] = job
            self._queue.put(job)
        return handle

    def check_fits(self, request: Request) -> None:
        """Raise `ContextOverflowError` unless the prompt and `max_tokens` fit the model's context (a loaded model
        that declares none is not checked)."""
        context = getattr(self.loaded, "context_length", None)
        prompt = request.prompt_length()
        if context and prompt + request.max_tokens > context:
            raise ContextOverflowError(f"the prompt has {prompt} tokens and asks for up to {request.max_tokens} "
                                       f"more; the model's context is {context} tokens")

    def submit_batch(self, batch: Sequence[Request], on_progress: ChunkCallback | None = None) -> list[RequestHandle]:
        """Queue requests sharing leading segments as one batch job where it can (`engine.batch`); a handle each."""
        return submit_batch(self, batch, on_progress)

    def set_window(self, window: Any) -> None:
        """Use another window policy (or None: exact attention) from the next request on. Checkpoints made under
        the old policy are not reused; the next request over the same tokens reports "policy mismatch". Any thread."""
        with self._lock:
            self._pending_window = (window,)

    def probe(self, segments: Sequence[SegmentLike]) -> Probe:
        """How much of a prompt could be restored right now, and why not more (any thread; no
        MLX work: cheap enough for every hover). See `PrefixCache.probe`."""
        return self.prefix.probe(segments)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is queued or running and the worker's work between requests (the archive's
        copies) is done, as after a user has read an answer; False if `timeout` seconds passed first."""
        return self._queue.idle.wait(timeout)

    def warm_prefix(self) -> tuple[SegmentLike, ...]:
        """The repository prefix last prefilled, while the engine still holds all of it, else ()
        (any thread). See `PrefixCache.warm_prefix`."""
        return self.prefix.warm_prefix()

    def cancel(self, request_id: str) -> None:
        """Stop a queued or running request; unknown or finished ids are ignored."""
        with self._lock:
            job = self._active.get(request_id)
        if job is not None:
            job.cancelled.set()

    def chat_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Token ids of `messages` rendered with the chat template, generation prompt added."""
        return self.tokenizer.encode(self.tokenizer.render_chat(messages, add_generation_prompt=True))

    def generate_text(
        self,
        prompt: str | Sequence[dict[str, Any]] | Sequence[int],
        *,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
    ) -> str:
        """Generate and return the whole answer (blocking).

        Args:
            prompt: A user message (str, rendered with the chat template), a
                list of chat messages, or token ids used as they are.
            max_tokens: Most tokens to generate.
            sampling: Greedy when None.
            stop: Stop strings (not included in the result).

        Raises:
            RequestCancelled: When the request was cancelled.
            EngineError: Whatever failed inside the engine.
        """
        if isinstance(prompt, str):
            ids = self.chat_ids([{"role": "user", "content": prompt}])
        elif prompt and isinstance(prompt[0], dict):
            ids = self.chat_ids(prompt)
        else:
            ids = list(prompt)
        request = Request(prompt_ids=ids, max_tokens=max_tokens,
                          sampling=sampling or SamplingParams(), stop=tuple(stop))
        done = self.submit(request).result()
        if done.finish_reason == "error":
            raise done.error
        if done.finish_reason == "cancelled":
            raise RequestCancelled(request.request_id)
        return done.text

    def stats(self) -> dict[str, Any]:
        """Counters for `codectx status` and benchmarks.

        ``"archive"`` is None without a disk archive, else "on" or "off: <reason>".
        """
        archive = self.prefix.archive
        with self._lock:
            return {
                "model_id": getattr(self.loaded, "model_id", None),
                "kv_bits": self.kv_bits,
                "window": None if self.window is None else dataclasses.asdict(self.window),
                "prefill_chunk": self.prefill_chunk,
                "compute": self.compute.describe(),
                "requests_served": self._counts["served"],
                "requests_cancelled": self._counts["cancelled"],
                "requests_failed": self._counts["failed"],
                "prompt_tokens": self._counts["prompt_tokens"],
                "decode_tokens": self._counts["decode_tokens"],
                "queued": len(self._active) - (self._running is not None),
                "running": self._running,
                "closed": self._closed,
                "cache": self.prefix.stats(),
                "archive": None if archive is None else archive.state,
                "mlx_memory": {"active_bytes": mx.get_active_memory(), "cache_bytes": mx.get_cache_memory(),
                               "peak_bytes": mx.get_peak_memory()},
            }

    def close(self) -> None:
        """Stop the worker: in-flight and queued requests end "cancelled". Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                for job in self._active.values():
                    job.cancelled.set()
                self._queue.put_close()
        if threading.current_thread() is not self._worker:
            self._worker.join()
            self.prefix.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- worker -----------------------------------------------------------

    def _apply_pending_window(self) -> None:
        with self._lock:
            pending, self._pending_window = self._pending_window, None
        if pending is None:
            return
        (self.window,) = pending
        policy, cache = policy_and_cache(self.loaded, self.compute, self.kv_bits,
                                         self.prefill_chunk, self.window)
        if policy.fingerprint() != self.prefix.policy.fingerprint():
            self.prefix.switch_policy(policy, cache, self.window if policy.approximation else None)

    def _work(self) -> None:
        try:
            while True:
                job = self._queue.get()
                if job is None:
                    break
                (job.serve or self._serve)(job)
                if not self.prefix.settle(stop=lambda: not self._queue.empty()):  # while none waits
                    self._queue.mark_idle()
            while not self._queue.empty():  # only jobs submitted before close() remain
                job = self._queue.get()
                if job is not None:
                    (job.serve or self._serve)(job)  # cancelled already: ends at once
            self.prefix.settle_archive()
        finally:
            self._queue.idle.set()
            # MLX keeps per-thread streams; left alive past this thread's exit they
            # abort the process at interpreter exit ("terminate called ...").
            mx.synchronize()
            mx.clear_streams()

    def _serve(self, job: Job) -> None:
        self._apply_pending_window()
        with self._lock:
            self._running = job.request.request_id
        metrics = Metrics(queue_s=time.perf_counter() - job.submitted)
        emitted: list[str] = []
        try:
            with self.prefix.request_scope():
                reason, error = self._generate(job, metrics, emitted), None
        except RequestCancelled:
            reason, error = "cancelled", None
            self.prefix.rollback()
            if self._requeue_preempted(job):
                return
        except Exception as err:  # the worker must survive anything one request does
            logger.exception("request %s failed", job.request.request_id)
            reason, error = "error", err
            self.prefix.rollback()
        self._finish(job, DoneEvent(job.request.request_id, reason, "".join(emitted), metrics, error))

    def _requeue_preempted(self, job: Job) -> bool:
        """Queue a preempted (not cancelled) job again; False when it must end instead."""
        with self._lock:
            if not job.preempted or job.cancelled.is_set() or self._closed:
                return False
            job.preempted = False
            self._running = None
            self._queue.put(job)
        logger.debug("request %s preempted; queued again", job.request.request_id)
        return True

    def _finish(self, job: Job, done: DoneEvent) -> None:
        with self._lock:
            self._active.pop(job.request.request_id, None)
            self._running = None
            key = {"cancelled": "cancelled", "error": "failed"}.get(done.finish_reason, "served")
            self._counts[key] += 1
            self._counts["prompt_tokens"] += done.metrics.recomputed_tokens
            self._counts["decode_tokens"] += done.metrics.decode_tokens
        job.handle.push(done)

    def _generate(self, job: Job, metrics: Metrics, emitted: list[str]) -> str:
        """Run one request; append emitted text to `emitted`; return the finish reason."""
        request = job.request
        if job.cancelled.is_set():
            raise RequestCancelled(request.request_id)
        metrics.prompt_tokens = request.prompt_length()
        logits = self._prefill(job, metrics)
        return "length" if request.max_tokens == 0 else self._stream(job, logits, metrics, emitted)

    def _prefill(self, job: Job, metrics: Metrics) -> mx.array:
        """Restore and prefill the prompt (and the draft model's); the last position's logits."""
        request = job.request

        def stop_prefill() -> bool:
            if job.cancelled.is_set():
                return True
            job.preempted = self._queue.outranked(request.priority)
            return job.preempted

        start = time.perf_counter()
        logits = self.prefix.prefill(request, self.prefill_chunk, stop_prefill, metrics,
                                     on_chunk=job.on_progress)
        if self.draft is not None and self.speculation in (Mode.DRAFT, Mode.AUTO):
            self.draft.prefill_request(request, stop_prefill, metrics)  # its own checkpoints
        metrics.prefill_s = time.perf_counter() - start
        return logits

    def _tokens(self, job: Job, logits: mx.array, metrics: Metrics) -> Iterator[int]:
        """The decode loop of this engine's speculation mode, from the prefill's logits."""
        request, cache = job.request, self.prefix.cache
        yields = request.priority == Priority.PREPARE  # a prepared answer gives way while it decodes

        def cancelled() -> bool:
            return job.cancelled.is_set() or (yields and self._queue.outranked(request.priority))

        sampler, penalty = make_sampler(request.sampling), RepetitionPenalty.of(request.sampling)
        if self.speculation is Mode.OFF:
            return decode(self.compute, cache, logits, sampler, request.max_tokens, self._eos, cancelled, penalty,
                          room=self.prefix.room)
        return speculative_decode(
            self.compute, cache, logits, sampler, request.max_tokens, self._eos, cancelled,
            prompt_ids=request.all_token_ids(), mode=self.speculation, sampling=request.sampling,
            draft=self.draft, metrics=metrics, penalty=penalty, room=self.prefix.room)

    def _stream(self, job: Job, logits: mx.array, metrics: Metrics, emitted: list[str]) -> str:
        """Decode and stream text events (`AnswerStream`) until a stop string, EOS, a loop or the length limit."""
        stream = AnswerStream(job, self.tokenizer, metrics, emitted)
        start = time.perf_counter()
        try:
            generated: list[int] = []
            for token in stream.guard.watch(self._tokens(job, logits, metrics)):
                generated.append(token)
                self.prefix.record_decoded(generated)  # periodic checkpoint of a long answer
                if stream.add(token):
                    return "stop"
        finally:
            metrics.decode_s = time.perf_counter() - start
        return stream.finish()
