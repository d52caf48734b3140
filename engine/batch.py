"""Answers that share a prefix, generated together: `submit_batch` and the worker's run of a batch.

    handles = engine.submit_batch([Request(segments=[*lead_in, head, tail], ...), ...])

On the NumPy-forward path (`engine.compute`), requests whose prompts start with
the same segments run as one job. The worker prefills the common segments as a
request of their own (restoring and recording checkpoints as every prefill
does), then the rows' remaining tokens in calls of at most `prefill_chunk`
tokens over that one live cache (`engine.batch_forward`: each token at its own
row's position, masked to the prefix and its own row), then decodes one token
per unfinished row per forward call: the weights are streamed and the prefix's
keys read once per step for all rows. Each row samples greedily and stops on
EOS, `max_tokens`, its stop strings and the loop guard, and streams through its
own detokenizer, exactly as a single request does (`engine.answer_stream`); its
handle gets the same events. Afterwards the live cache is rolled back to the
confirmed line (the common prefix): nothing of the rows stays in the cache or
the checkpoints.

Anywhere else (the MLX paths, sampling with a temperature, requests without a
common leading segment, caches that do not return every key: 8-bit or
windowed) the requests run one by one as ordinary jobs, so callers need no
branch.

A batch takes its place in the queue at the most urgent priority of its rows.
Still prefilling, it yields to more urgent work as a single request does
(rolled back, queued again in its old place); a PREPARE batch that is decoding
ends at the next forward call instead: rows already finished keep their
answers, the others end "cancelled" with the text they had streamed. A row
cancelled on its own ends at the next forward call; the others go on.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from engine import state
from engine.answer_stream import AnswerStream
from engine.batch_forward import TreeLayout, tree_forward
from engine.errors import EngineClosedError, RequestCancelled
from engine.handle import RequestHandle
from engine.jobs import Job
from engine.request import DoneEvent, Metrics, Priority, Request
from engine.sampling import RepetitionPenalty, make_sampler
from engine.window import WindowKVCache

logger = logging.getLogger(__name__)


def submit_batch(engine: Any, requests: Sequence[Request],
                 on_progress: Callable[[int, int], None] | None = None) -> list[RequestHandle]:
    """Queue `requests` as one batch where the engine can, else one by one (`Engine.submit_batch`)."""
    requests = list(requests)
    for request in requests:
        engine.check_fits(request)
    common = common_segments(requests)
    if (len(requests) < 2 or common == 0 or engine.compute.numpy_forward is None
            or any(r.sampling.temperature != 0 for r in requests)):
        return [engine.submit(r, on_progress=on_progress) for r in requests]
    handles = [RequestHandle(r, engine.cancel) for r in requests]
    ids = [r.request_id for r in requests]
    with engine._lock:
        if engine._closed:
            raise EngineClosedError("engine is closed")
        taken = [i for i in ids if i in engine._active] + [i for n, i in enumerate(ids) if i in ids[:n]]
        if taken:
            raise ValueError(f"request id {taken[0]!r} is already in flight")
        marker = Request(prompt_ids=(), max_tokens=0, priority=min(r.priority for r in requests),
                         request_id=f"batch-{ids[0]}")
        job = engine._queue.new_job(marker, None, on_progress)
        rows = [engine._queue.new_job(r, h, None) for r, h in zip(requests, handles)]
        job.serve = lambda batch_job: _Batch(engine, batch_job, rows, common).run()
        for row in rows:
            engine._active[row.request.request_id] = row
        engine._queue.put(job)
    return handles


def common_segments(requests: Sequence[Request]) -> int:
    """How many leading segments every request shares (kind, key and tokens), leaving each at
    least one token of its own; 0 for token prompts or when they share no token."""
    if not requests or any(r.segments is None for r in requests):
        return 0
    first = list(requests[0].segments)
    limit = min(len(r.segments) for r in requests) - 1
    n = 0
    while n < limit and all(_same(r.segments[n], first[n]) for r in requests):
        n += 1
    prefix = sum(len(s.token_ids) for s in first[:n])
    while n and any(r.prompt_length() == prefix for r in requests):  # a row needs a token of its own
        n -= 1
        prefix -= len(first[n].token_ids)
    return n if prefix else 0


def _same(a: Any, b: Any) -> bool:
    return (a.kind, a.key, tuple(a.token_ids)) == (b.kind, b.key, tuple(b.token_ids))


def batchable_cache(cache: Sequence[Any]) -> bool:
    """True when every layer returns all its keys in full precision (plain `KVCache`, or a window
    cache over full-precision storage: a batch's positions all come after its dense start)."""
    return all(type(c) is KVCache or (isinstance(c, WindowKVCache) and not c.store.quantized) for c in cache)


class _Row:
    """One answer of a batch: its sampler and its stream (`AnswerStream`: stop strings, loop guard, detokenizer,
    events)."""

    def __init__(self, index: int, job: Job, tokenizer: Any, eos: frozenset[int]) -> None:
        request = self.request = job.request
        self.index, self.job, self.eos = index, job, eos
        self.metrics = Metrics()
        self.emitted: list[str] = []
        self.stream = AnswerStream(job, tokenizer, self.metrics, self.emitted)
        self.sampler, self.penalty = make_sampler(request.sampling), RepetitionPenalty.of(request.sampling)
        self.suffix: list[int] = []
        self.logits: np.ndarray | None = None
        self.last = 0
        self.decode_start = 0.0
        self.ended = job.handle.done  # a row ended in an earlier run of its batch

    def take(self) -> str | None:
        """Samples and streams the next token from `logits`; the finish reason when the row ends."""
        logits = mx.array(self.logits[None])
        token = int(self.sampler(logits if self.penalty is None else self.penalty.apply(logits)).item())
        if token in self.eos:
            return self.stream.finish()
        if self.penalty is not None:
            self.penalty.observe((token,))
        if self.stream.add(token):
            return "stop"
        if self.stream.guard.observe(token) or self.metrics.decode_tokens >= self.request.max_tokens:
            return self.stream.finish()
        self.last = token
        return None


class _Batch:
    """One run of a batch job on the engine's worker (a preempted batch gets a fresh run)."""

    def __init__(self, engine: Any, job: Job, rows: list[Job], common: int) -> None:
        self.engine, self.job, self.common = engine, job, common
        self.rows = [_Row(i, row, engine.tokenizer, engine._eos) for i, row in enumerate(rows)]
        self.priority = job.request.priority
        self.preempted = False
        self.started = time.perf_counter()

    def run(self) -> None:
        engine = self.engine
        engine._apply_pending_window()
        with engine._lock:
            engine._running = self.job.request.request_id
        try:
            live = self._live()
            if live and not batchable_cache(engine.prefix.cache):  # a window or KV policy changed since submit
                for row in live:
                    engine._queue.put(row.job)
            elif live:
                self._decode(self._prefill(live))
        except RequestCancelled:
            if not (self.preempted and self._requeue()):
                self._end_all("cancelled")
        except Exception as err:  # the worker must survive anything one batch does
            logger.exception("batch %s failed", self.job.request.request_id)
            self._end_all("error", err)
        finally:
            engine.prefix.rollback()  # back to the confirmed line: nothing of the rows stays
            with engine._lock:
                engine._running = None

    def _live(self) -> list[_Row]:
        """The rows still running; a cancelled one ends here."""
        for row in self.rows:
            if not row.ended and row.job.cancelled.is_set():
                self._end(row, "cancelled")
        return [row for row in self.rows if not row.ended]

    def _stop(self) -> bool:
        """Between forward calls of the prefill: True when no row is left or more urgent work waits."""
        if not self._live():
            return True
        self.preempted = self.engine._queue.outranked(self.priority)
        return self.preempted

    def _prefill(self, live: list[_Row]) -> TreeLayout:
        """The common segments as one request, then every row's own tokens; each row's last logits."""
        engine, request = self.engine, live[0].request
        segments = list(request.segments[:self.common])
        prefix = sum(len(s.token_ids) for s in segments)
        for row in live:
            row.suffix = row.request.token_ids_from(prefix)
        total = prefix + sum(len(row.suffix) for row in live)
        progress = self.job.on_progress
        metrics = Metrics()
        engine.prefix.prefill(Request(segments=segments, max_tokens=0, priority=self.priority,
                                      request_id=self.job.request.request_id), engine.prefill_chunk,
                              self._stop, metrics, on_chunk=progress and (lambda done, _: progress(done, total)))
        if state.attention_offset(engine.prefix.cache) != prefix:
            raise state.StateError(f"the common prefix left the cache at {state.attention_offset(engine.prefix.cache)}")
        layout = TreeLayout(prefix)
        stream = [(row, token) for row in live for token in row.suffix]
        for start in range(0, len(stream), engine.prefill_chunk):
            if self._stop():
                raise RequestCancelled(f"batch stopped during prefill at token {prefix + start}")
            chunk = [(row, token) for row, token in stream[start:start + engine.prefill_chunk] if not row.ended]
            if chunk:
                self._forward(layout, chunk, _last_of_rows(layout, chunk))
            if progress is not None:
                progress(min(total, prefix + start + engine.prefill_chunk), total)
        elapsed = time.perf_counter() - self.started
        for n, row in enumerate(live):
            row.metrics.queue_s = self.started - row.job.submitted
            row.metrics.prompt_tokens, row.metrics.cached_tokens = prefix + len(row.suffix), metrics.cached_tokens
            row.metrics.recomputed_tokens = len(row.suffix) + (metrics.recomputed_tokens if n == 0 else 0)
            row.metrics.miss_reason, row.metrics.checkpoint_bytes = metrics.miss_reason, metrics.checkpoint_bytes
            row.metrics.prefill_s = elapsed
        return layout

    def _forward(self, layout: TreeLayout, chunk: list[tuple[_Row, int]], want: list[int]) -> None:
        """One forward call over `chunk` (rows and their tokens); the rows at `want` get their logits."""
        placed = layout.place([row.index for row, _ in chunk])
        logits = tree_forward(self.engine.compute.numpy_forward, self.engine.prefix.cache,
                              [token for _, token in chunk], placed, want)
        for i, row_logits in zip(want, logits):
            chunk[i][0].logits = row_logits

    def _decode(self, layout: TreeLayout) -> None:
        """One token per unfinished row per forward call, until every row has ended."""
        yields = self.priority == Priority.PREPARE  # a prepared answer gives way while it decodes
        active = self._live()
        for row in [r for r in active if r.request.max_tokens == 0]:
            self._end(row, "length")
        active = [row for row in active if not row.ended]
        start = time.perf_counter()
        for row in active:
            row.decode_start = start
        while active:
            feed = []
            for row in active:
                reason = row.take()
                if reason is None:
                    feed.append(row)
                else:
                    self._end(row, reason)
            live = set(map(id, self._live()))
            feed = [row for row in feed if id(row) in live]
            if feed and yields and self.engine._queue.outranked(self.priority):
                for row in feed:
                    self._end(row, "cancelled")
                return
            if feed:
                self._forward(layout, [(row, row.last) for row in feed], list(range(len(feed))))
            active = feed

    def _requeue(self) -> bool:
        """Queue a batch preempted in prefill again, in its old place; False when it must end."""
        engine = self.engine
        with engine._lock:
            if engine._closed:
                return False
            engine._queue.put(self.job)
        logger.debug("batch %s preempted; queued again", self.job.request.request_id)
        return True

    def _end_all(self, reason: str, error: Exception | None = None) -> None:
        for row in self.rows:
            if not row.ended:
                self._end(row, reason, error)

    def _end(self, row: _Row, reason: str, error: Exception | None = None) -> None:
        row.ended = True
        if row.decode_start:
            row.metrics.decode_s = time.perf_counter() - row.decode_start
        done = DoneEvent(row.request.request_id, reason, "".join(row.emitted), row.metrics, error)
        engine = self.engine
        engine._finish(row.job, done)
        with engine._lock:
            engine._running = self.job.request.request_id  # `_finish` cleared it; the batch goes on


def _last_of_rows(layout: TreeLayout, chunk: list[tuple[_Row, int]]) -> list[int]:
    """Indices into `chunk` of the tokens that end their row's prompt."""
    placed: dict[int, int] = {}
    last = []
    for i, (row, _) in enumerate(chunk):
        placed[row.index] = placed.get(row.index, layout.length(row.index)) + 1
        if placed[row.index] == len(row.suffix):
            last.append(i)
    return last
