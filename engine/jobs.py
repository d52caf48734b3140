"""The engine's queue: jobs in priority order, FIFO within a priority.

`JobQueue` also counts which priorities are waiting, so a running prefill can
ask whether it is outranked (and yield at its next chunk boundary), and it
keeps each job's place: a preempted job queued again goes back where it was.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.request import Request

_CLOSE = -1  # sorts before every Priority, so close() is seen next


@dataclass
class Job:
    """One submitted request on its way through the worker."""

    request: Request
    handle: Any
    on_progress: Callable[[int, int], None] | None
    seq: int
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    preempted: bool = False
    serve: Callable[[Job], None] | None = None  # runs it instead of the worker's own serve (`engine.batch`)


class JobQueue:
    """Jobs by `Request.priority` (lowest first), then by submission order; thread-safe."""

    def __init__(self) -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._waiting: Counter[int] = Counter()  # priorities of queued, not running, jobs
        self.idle = threading.Event()  # nothing queued, and the worker done with its work after the last job
        self.idle.set()

    def new_job(self, request: Request, handle: Any, on_progress: Callable[[int, int], None] | None) -> Job:
        """A job with the next place in line (not queued yet)."""
        return Job(request, handle, on_progress, next(self._seq))

    def put(self, job: Job) -> None:
        """Queue `job` at its priority and its original FIFO place."""
        with self._lock:  # queued under the lock, so `mark_idle` never sees it cleared and still empty
            self._waiting[int(job.request.priority)] += 1
            self.idle.clear()
            self._queue.put((int(job.request.priority), job.seq, job))

    def put_close(self) -> None:
        """Make `get` return None next (before any queued job)."""
        self._queue.put((_CLOSE, next(self._seq), None))

    def get(self) -> Job | None:
        """The next job (blocking), or None for a close marker."""
        _, _, job = self._queue.get()
        if job is not None:
            with self._lock:
                self._waiting[int(job.request.priority)] -= 1
        return job

    def empty(self) -> bool:
        return self._queue.empty()

    def mark_idle(self) -> None:
        """The worker has nothing left to do: `idle`, unless a job arrived meanwhile."""
        with self._lock:
            if self._queue.empty():
                self.idle.set()

    def outranked(self, priority: int) -> bool:
        """True when a queued job has a more urgent priority than `priority`."""
        with self._lock:
            return any(count and waiting < priority for waiting, count in self._waiting.items())
