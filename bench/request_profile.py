"""Where a request's time goes in Python: `cProfile` around the engine worker's serving of each request.

The engine serves requests on its worker thread, so a profiler started by the caller sees
none of it; `profiled()` wraps `Engine._serve` for as long as it is entered and keeps one
`cProfile.Profile` per request. Time the host spends waiting for the device (`mx.eval`, a
read of a device array) is charged to the Python function that waited.

    with request_profile.profiled() as profiles:
        ask(...)
    top = request_profile.top(profiles[-1])
"""
from __future__ import annotations

import contextlib
import cProfile
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
