"""Warnings that a flood of bad clients could repeat thousands of times a second, rate-limited."""
from __future__ import annotations

import logging
import threading
import time

INTERVAL_S = 10.0


class RateLimitFilter(logging.Filter):
    """Lets one record per message template through every `interval` seconds.

    The next record let through after a quiet spell says how many were held
    back, so the log shows the flood's size without its volume.

    Args:
        interval: Seconds between two records of the same template.
    """

    def __init__(self, interval: float = INTERVAL_S) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like this in the last {now - last:.0f} s)"
        return True


def limited_logger(name: str, interval: float = INTERVAL_S) -> logging.Logger:
    """The logger `name` with a `RateLimitFilter` attached (once, however often this is called)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
        logger.addFilter(RateLimitFilter(interval))
    return logger
