"""`AnswerStream`: one answer's tokens turned into text events, as a single request (`engine.engine`) and each
answer of a batch (`engine.batch`) stream them.

Each token goes through the request's detokenizer and stop strings; the text that is then safe to show goes
to the request's handle as a `TokenEvent` carrying the ids it came from (the first one sets the metrics'
TTFT). The request's loop guard (`engine.loop_guard`) watches the same tokens; the caller feeds it, in the
order its loop needs. `finish` flushes what is held back and names why the answer ended.
"""
from __future__ import annotations

import time
from typing import Any

from engine.generate import StopStrings
from engine.jobs import Job
from engine.loop_guard import LoopGuard
from engine.request import Metrics, TokenEvent


class AnswerStream:
    """The text events of one answer.

    Args:
        job: The request's job (its handle receives the events; its submission time starts the TTFT).
        tokenizer: The engine's tokenizer (its detokenizer and the loop guard's keys).
        metrics: The answer's metrics: decoded tokens, TTFT, and the loop guard's findings.
        emitted: Receives each text as it is pushed (the answer's text, also after a cancel or an error).
    """

    def __init__(self, job: Job, tokenizer: Any, metrics: Metrics, emitted: list[str]) -> None:
        request = self.request = job.request
        self.job, self.metrics, self.emitted = job, metrics, emitted
        self.guard = LoopGuard(request.sampling.loop_guard, metrics, tokenizer.loop_keys)
        self.detok = tokenizer.detokenizer(continuation=request.continues_answer())
        self.stops = StopStrings(request.stop)
        self._pending: list[int] = []  # ids whose text is still held back

    def add(self, token: int) -> bool:
        """Stream one decoded token (not an EOS); True when a stop string ended the answer there."""
        self.metrics.decode_tokens += 1
        self._pending.append(token)
        self._emit(self.stops.push(self.detok.add(token)))
        return self.stops.stopped

    def finish(self) -> str:
        """Push the text held back; the finish reason: "repetition" (the loop guard fired), "stop" (a stop
        string, or the model ended before the length limit) or "length"."""
        self._emit(self.stops.push(self.detok.finalize()) + self.stops.flush())
        if self.guard.fired:
            return "repetition"
        if self.stops.stopped or self.metrics.decode_tokens < self.request.max_tokens:
            return "stop"
        return "length"

    def _emit(self, text: str) -> None:
        if not text:
            return
        if not self.metrics.ttft_s:
            self.metrics.ttft_s = time.perf_counter() - self.job.submitted
        self.emitted.append(text)
        self.job.handle.push(TokenEvent(self.request.request_id, text, tuple(self._pending)))
        self._pending.clear()
