"""Timing device work for the measured choices (`engine.decode_choice`) and the benchmarks."""
from __future__ import annotations

import time
from typing import Any, Callable

import mlx.core as mx


def seconds(run: Callable[[], Any]) -> float:
    """One evaluation of `run()`'s arrays. The device is synchronized before and after, so queued
    work is neither counted nor left out."""
    mx.synchronize()
    start = time.perf_counter()
    mx.eval(run())
    mx.synchronize()
    return time.perf_counter() - start


def best_seconds(run: Callable[[], Any], repeats: int = 5) -> float:
    """The fastest of `repeats` evaluations of `run()` (`seconds`), after one untimed evaluation
    (kernel compilation)."""
    seconds(run)
    return min(seconds(run) for _ in range(repeats))


def median_seconds(run: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    """The median of `repeats` evaluations of `run()` (`seconds`), after `warmup` untimed ones."""
    for _ in range(warmup):
        seconds(run)
    times = sorted(seconds(run) for _ in range(repeats))
    return times[len(times) // 2]
