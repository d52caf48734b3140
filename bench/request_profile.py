"""Where a request's time goes in Python: `cProfile` around the engine worker's serving of each request.

The engine serves requests on its worker thread, so a profiler started by the caller sees
none of it; `profiled()` wraps `Engine._serve` for as long as it is entered and keeps one
`cProfile.Profile` per request. Time the host spends waiting for the device (`mx.eval`, a
read of a device array) is charged to the Python function that waited.

    with request_profile.profiled() as profiles:
        ask(...)
    top = request_profile.top(profiles[-1])

`ForwardLog` collects the engine's own debug lines instead: each prefill forward's tokens and
seconds, the restore's, and each decode step's host seconds, with no profiler's overhead;
`decode_host` sums the decode steps up, and `token_gaps` the pace of the tokens as the caller
received them.
"""
from __future__ import annotations

import contextlib
import cProfile
import logging
import pstats
from typing import Any, Iterator

from engine.engine import Engine


@contextlib.contextmanager
def profiled() -> Iterator[list[cProfile.Profile]]:
    """Profile every request the engines of this process serve while inside; yields the profiles, in order."""
    profiles: list[cProfile.Profile] = []
    original = Engine._serve

    def serve(self: Engine, job: Any) -> None:
        profile = cProfile.Profile()
        try:
            profile.enable()
        except ValueError:  # another profiler is active on this thread: serve unprofiled
            return original(self, job)
        profiles.append(profile)
        try:
            original(self, job)
        finally:
            profile.disable()

    Engine._serve = serve
    try:
        yield profiles
    finally:
        Engine._serve = original


def top(profile: cProfile.Profile, count: int = 25) -> list[dict[str, Any]]:
    """The `count` functions with the most time of their own, with their cumulative time."""
    stats = pstats.Stats(profile)
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():
        rows.append({"function": f"{path.rsplit('/', 2)[-1] if '/' in path else path}:{line}:{name}",
                     "calls": calls, "own_s": round(own, 4), "cumulative_s": round(cumulative, 4)})
    rows.sort(key=lambda r: r["own_s"], reverse=True)
    return rows[:count]


class ForwardLog(logging.Handler):
    """The engine's debug lines for the requests served while attached: each prefill forward as
    [tokens, keys after it, seconds including the wait for its evaluation], the restore's seconds, and
    each decode step's host milliseconds in `decode_steps`: [building the step last queued, submitting
    it, waiting for the token then read] (`engine.generate.decode`: one record per token read after a
    step was built); each checkpoint recorded during the prefill as [tokens, seconds] in `records` (its copy
    for the archive included until the seventeenth session; since, made between requests), each detach of
    the checkpoints a restore leaves behind in `detaches`, and each batch of the archive's copies the worker made
    while attached as [checkpoints, seconds] in `archive_copies` (`engine.checkpoints.CheckpointStore.settle`:
    those a restore makes before it overwrites their rows count in its seconds too).

        with request_profile.ForwardLog() as log:
            ask(...)
        log.forwards, log.restore_s, log.decode_steps, log.records, log.detaches, log.archive_copies
    """

    LOGGERS = ("engine.generate", "engine.prefix_cache", "engine.checkpoints")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.forwards: list[list[float]] = []
        self.restore_s: float | None = None
        self.decode_steps: list[list[float]] = []
        self.records: list[list[float]] = []
        self.detaches: list[list[float]] = []
        self.archive_copies: list[list[float]] = []
        self._levels: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        forward = getattr(record, "forward", None)  # the fields the engine attaches to these lines
        if forward is not None:
            tokens, keys, seconds = forward
            self.forwards.append([tokens, keys, round(seconds, 4)])
        step = getattr(record, "decode_step", None)
        if step is not None:
            self.decode_steps.append([round(s * 1e3, 3) for s in step])
        for field, into in (("record", self.records), ("detach", self.detaches), ("archive_copy", self.archive_copies)):
            value = getattr(record, field, None)
            if value is not None:
                into.append([value[0], round(value[1], 4)])
        restore_s = getattr(record, "restore_s", None)
        if restore_s is not None:
            self.restore_s = round(restore_s, 4)

    def __enter__(self) -> "ForwardLog":
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            self._levels.append(logger.level)
            logger.setLevel(logging.DEBUG)
            logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, level in zip(self.LOGGERS, self._levels):
            logger = logging.getLogger(name)
            logger.removeHandler(self)
            logger.setLevel(level)


def token_gaps(arrivals: list[tuple[float, int]]) -> dict[str, Any] | None:
    """Milliseconds per token between token events (an event's gap shared by the tokens it carries): the
    first three, the median, the 90th percentile and the largest. Whether the decode rate is an even
    pace or a few stalls (a step's first graphs, a checkpoint, another thread)."""
    gaps: list[float] = []
    for (before, _), (after, count) in zip(arrivals, arrivals[1:]):
        gaps += [(after - before) * 1e3 / count] * count
    if not gaps:
        return None
    sorted_gaps = sorted(gaps)
    return {"first": [round(g, 2) for g in gaps[:3]], "p50": round(sorted_gaps[len(gaps) // 2], 2),
            "p90": round(sorted_gaps[int(len(gaps) * 0.9)], 2), "max": round(sorted_gaps[-1], 2)}


def decode_host(steps: list[list[float]]) -> dict[str, float] | None:
    """Medians over an ask's decode steps (the first left out: the first step at a new length builds new
    graphs) of the engine's host milliseconds per step: building a step's graph, submitting it
    (`mx.async_eval`, which also waits while MLX has too much queued), waiting for a token."""
    steps = steps[1:]
    if not steps:
        return None
    return {name: round(sorted(s[i] for s in steps)[len(steps) // 2], 3)
            for i, name in enumerate(("build", "submit", "wait"))}


def step_counts(eng: Engine) -> tuple[int, int]:
    """How often `eng`'s compiled one-token step has traced and fallen back to the plain call so far (both 0
    when its path does not compile): a step that falls back builds the whole model's graph for one token."""
    step = eng.compute.decode_step
    return (step.traces, step.fallbacks) if step is not None else (0, 0)
