"""Background warm-up: re-prefill the stable prefix after the user pauses.

Edits bump `Session.prefix_version`; each edit (re)starts one debounce timer.
When it fires, the prefix is prefilled at BACKGROUND priority (max_tokens=0),
so interactive requests preempt it at chunk boundaries. A new edit during a
warm-up cancels it: its work up to the last confirmed checkpoint is kept.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from engine.request import Priority

from .session import Session

logger = logging.getLogger(__name__)


class Warmup:
    """Debounced background prefill for one session.

    Args:
        session: The session whose prefix is kept warm.
        on_state: Called with `state()` after every finished warm-up.
    """

    def __init__(self, session: Session, on_state: Callable[[dict], None] | None = None) -> None:
        self.session = session
        self.on_state = on_state
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self.warm_version = -1
        self.prefix_tokens = 0
        self.runs = 0
        self.last_error: str | None = None

    def schedule(self, delay_s: float, key: str | None = None) -> None:
        """(Re)starts the debounce timer; `key` names the edited file (for logs)."""
        if not self.session.settings.warmup.enabled:
            return
        if self._timer is not None:
            self._timer.cancel()
        logger.debug("warm-up scheduled in %.2fs after %s", delay_s, key or "start-up")
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._start)

    def _start(self) -> None:
        self._timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        version = self.session.prefix_version
        segments = self.session.prompt.prefix_segments()
        try:
            done = await self.session.generate(segments, max_tokens=0, priority=Priority.BACKGROUND)
        except asyncio.CancelledError:
            return
        except Exception as err:  # noqa: BLE001 - warm-up failures are reported in status only
            self.last_error = str(err)
            logger.warning("warm-up failed: %s", err)
            return
        if done.finish_reason != "cancelled":
            self.warm_version = version
            self.prefix_tokens = done.metrics.prompt_tokens
            self.runs += 1
            self.session.counters.warmups += 1
            if self.on_state is not None:
                self.on_state(self.state())

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def state(self) -> dict:
        """How warm the prefix is, for `codectx.status`."""
        return {"warm": self.warm_version == self.session.prefix_version, "running": self.running,
                "pending": self._timer is not None, "prefixTokens": self.prefix_tokens,
                "runs": self.runs, "lastError": self.last_error}

    def stop(self) -> None:
        """Cancels the timer and any running warm-up (shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
