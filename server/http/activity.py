"""What the monitor shows: requests in flight (running estimates) and completed ones (final numbers).

A `Tracked` request is updated from the event loop (prefill progress arrives
through `call_soon_threadsafe`, tokens as the stream is read). While it runs,
`live()` gives estimates; when its `DoneEvent` arrives, the engine's final
`Metrics` are stored apart in `RecentRequest` and the running estimates are
dropped, so a completed row never mixes the two.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.request import DoneEvent

PREVIEW_CHARS = 80
_ids = itertools.count(1)


@dataclass
class Tracked:
    """One HTTP request in flight (running estimates only)."""

    request_id: str
    model: str
    preview: str
    prompt_tokens: int
    stream: bool
    started_wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    prefill_done: int = 0
    prefill_at: float | None = None
    first_token_at: float | None = None
    decode_tokens: int = 0

    def on_prefill(self, done: int, total: int) -> None:
        self.prefill_done = done
        self.prefill_at = time.perf_counter()

    def on_tokens(self, count: int) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.decode_tokens += count

    def live(self) -> dict[str, Any]:
        """Running estimates (not the engine's final metrics)."""
        now = time.perf_counter()
        phase = "decode" if self.first_token_at else ("prefill" if self.prefill_at else "queued")
        decode_s = now - self.first_token_at if self.first_token_at else 0.0
        return {
            "id": self.request_id, "model": self.model, "preview": self.preview, "stream": self.stream,
            "phase": phase, "started": self.started_wall, "elapsed_s": now - self.started,
            "prompt_tokens": self.prompt_tokens, "prefill_done_tokens": self.prefill_done,
            "ttft_s": (self.first_token_at - self.started) if self.first_token_at else None,
            "decode_tokens": self.decode_tokens,
            "decode_tps_estimate": self.decode_tokens / decode_s if decode_s > 0 else None,
        }


@dataclass(frozen=True)
class RecentRequest:
    """A completed request with the engine's final metrics."""

    request_id: str
    model: str
    preview: str
    started: float
    finish_reason: str
    metrics: dict[str, Any]

    def row(self) -> dict[str, Any]:
        return {"id": self.request_id, "model": self.model, "preview": self.preview, "started": self.started,
                "finish_reason": self.finish_reason, **self.metrics}


@dataclass
class Totals:
    """Counters over completed HTTP chat requests (what /metrics exports)."""

    requests: dict[str, int] = field(default_factory=dict)  # by finish reason
    prompt_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0
    completion_tokens: int = 0
    rejected: int = 0  # answered with a 4xx before reaching the engine
    refused: dict[str, int] = field(default_factory=dict)  # any request refused by the Host/Origin guard, by code


class Activity:
    """Active and recent HTTP requests (event-loop thread only).

    Args:
        recent: How many completed requests to keep.
        on_finish: Called with each completed request's finish reason (the request counters).
    """

    def __init__(self, recent: int = 50, on_finish: Callable[[str], None] | None = None) -> None:
        self.on_finish = on_finish
        self.active: dict[str, Tracked] = {}
        self.recent: deque[RecentRequest] = deque(maxlen=recent)
        self.totals = Totals()

    def start(self, model: str, preview: str, prompt_tokens: int, stream: bool) -> Tracked:
        """Register a request about to be submitted; returns its tracker."""
        tracked = Tracked(f"chatcmpl-{next(_ids)}-{int(time.time())}", model, preview[:PREVIEW_CHARS],
                          prompt_tokens, stream)
        self.active[tracked.request_id] = tracked
        return tracked

    def finish(self, tracked: Tracked, done: DoneEvent) -> RecentRequest:
        """Move a request to the recent list with its final metrics."""
        self.active.pop(tracked.request_id, None)
        metrics = done.metrics.as_dict()
        recent = RecentRequest(tracked.request_id, tracked.model, tracked.preview, tracked.started_wall,
                               done.finish_reason, metrics)
        self.recent.appendleft(recent)
        t = self.totals
        t.requests[done.finish_reason] = t.requests.get(done.finish_reason, 0) + 1
        t.prompt_tokens += done.metrics.prompt_tokens
        t.cached_tokens += done.metrics.cached_tokens
        t.recomputed_tokens += done.metrics.recomputed_tokens
        t.completion_tokens += done.metrics.decode_tokens
        if self.on_finish is not None:
            self.on_finish(done.finish_reason)
        return recent

    def refuse(self, code: str) -> None:
        """Count a request the Host/Origin guard refused (`code` as in its error body)."""
        self.totals.refused[code] = self.totals.refused.get(code, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready state for /monitor/state."""
        return {"active": [t.live() for t in self.active.values()],
                "recent": [r.row() for r in self.recent],
                "totals": {"requests": dict(self.totals.requests), "prompt_tokens": self.totals.prompt_tokens,
                           "cached_tokens": self.totals.cached_tokens,
                           "recomputed_tokens": self.totals.recomputed_tokens,
                           "completion_tokens": self.totals.completion_tokens,
                           "rejected": self.totals.rejected, "refused": dict(self.totals.refused)}}
