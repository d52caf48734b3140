"""Timing device work for the measured choices (`engine.decode_choice`) and the benchmarks."""
from __future__ import annotations

import time
from typing import Any, Callable

import mlx.core as mx


def best_seconds(run: Callable[[], Any], repeats: int = 5) -> float:
    """The fastest of `repeats` evaluations of `run()`, after one untimed evaluation (kernel compilation).

    The device is synchronized before and after each, so queued work is neither counted nor left out.
    """
    best = float("inf")
    for attempt in range(repeats + 1):
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(run())
        mx.synchronize()
        if attempt:
            best = min(best, time.perf_counter() - start)
    return best
