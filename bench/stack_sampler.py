"""Where a thread's time goes, by sampling its Python stack (a py-spy in the process, for machines without one).

`StackSampler` reads one named thread's current frame every `interval` seconds from a thread of
its own and counts two things per sample: the innermost frame (the line running, or the line
waiting in a call into C: MLX building or submitting an operation, reading a device array), and
the innermost frame in each of `anchors` (files whose lines say where a loop is, such as
engine/generate.py's decode loop: building a step, reading a token, yielding it). Unlike
`cProfile` it adds nothing to each Python call, so a host-bound loop keeps its pace; the
sampler itself holds the interpreter lock for a few microseconds per sample.

    with StackSampler("codectx-engine") as sampler:
        ask(...)
    sampler.top()   # {"innermost": [...], "generate.py": [...]} as (frame, samples, ms) rows
"""
from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any, Sequence


def _where(frame: Any) -> str:
    path = frame.f_code.co_filename
    return f"{path.rsplit('/', 2)[-2]}/{path.rsplit('/', 1)[-1]}:{frame.f_lineno}:{frame.f_code.co_name}" \
        if "/" in path else f"{path}:{frame.f_lineno}:{frame.f_code.co_name}"


class StackSampler:
    """Samples the stack of the (live) thread named `thread_name` while entered.

    Args:
        thread_name: The sampled thread's name (the first live one with it, looked up at every sample,
            so an engine built while sampling is found).
        interval: Seconds between samples.
        anchors: File names (``generate.py``) whose innermost frame is counted apart.
    """

    def __init__(self, thread_name: str, interval: float = 0.001,
                 anchors: Sequence[str] = ("generate.py", "engine.py")) -> None:
        self.thread_name, self.interval, self.anchors = thread_name, interval, tuple(anchors)
        self.counts: dict[str, collections.Counter] = {key: collections.Counter() for key in ("innermost", *anchors)}
        self.samples = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StackSampler:
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds = time.perf_counter() - self._started

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            ident = next((t.ident for t in threading.enumerate() if t.name == self.thread_name and t.is_alive()),
                         None)
            frame = sys._current_frames().get(ident) if ident is not None else None
            if frame is None:
                continue
            self.samples += 1
            self.counts["innermost"][_where(frame)] += 1
            pending = set(self.anchors)
            while frame is not None and pending:
                name = frame.f_code.co_filename.rsplit("/", 1)[-1]
                if name in pending:
                    self.counts[name][_where(frame)] += 1
                    pending.discard(name)
                frame = frame.f_back

    def top(self, count: int = 12) -> dict[str, list[tuple[str, int, float]]]:
        """Per kind of count, the `count` most sampled frames: (frame, samples, milliseconds at the interval
        actually achieved)."""
        per_sample = self.seconds * 1e3 / self.samples if self.samples else 0.0
        return {key: [(where, n, round(n * per_sample, 1)) for where, n in counter.most_common(count)]
                for key, counter in self.counts.items()}
