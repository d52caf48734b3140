"""`RequestHandle`: the caller's end of one submitted request.

The engine's worker pushes events; the caller reads them either as a plain
iterator (blocking) or as an async iterator (awaiting, without blocking the
event loop). Every request ends with exactly one `DoneEvent`.
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator, Callable, Iterator

from .request import DoneEvent, Event, Request


class RequestHandle:
    """Events of one request, readable once, from one consumer.

    Attributes:
        request: The submitted request.
    """

    def __init__(self, request: Request, cancel: Callable[[str], None]) -> None:
        self.request = request
        self._cancel = cancel
        self._events: list[Event] = []
        self._read = 0
        self._done: DoneEvent | None = None
        self._cond = threading.Condition()
        self._wakeups: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def done(self) -> bool:
        """True once the `DoneEvent` has been pushed (not necessarily read)."""
        return self._done is not None

    def cancel(self) -> None:
        """Ask the engine to stop this request (idempotent; ends with a DoneEvent)."""
        self._cancel(self.request_id)

    def push(self, event: Event) -> None:
        """Deliver an event (called by the engine's worker thread)."""
        with self._cond:
            if self._done is not None:
                raise RuntimeError(f"{self.request_id}: event after DoneEvent")
            self._events.append(event)
            if isinstance(event, DoneEvent):
                self._done = event
            self._cond.notify_all()
            wakeups = list(self._wakeups)
        for loop, flag in wakeups:
            loop.call_soon_threadsafe(flag.set)

    def result(self, timeout: float | None = None) -> DoneEvent:
        """Block until the request ends and return its `DoneEvent`.

        Raises:
            TimeoutError: When `timeout` seconds pass first.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._done is not None, timeout):
                raise TimeoutError(f"{self.request_id} did not finish in {timeout} s")
            return self._done

    def _next_unread(self) -> Event | None:
        with self._cond:
            if self._read < len(self._events):
                self._read += 1
                return self._events[self._read - 1]
            return None

    def _drained(self) -> bool:
        return self._done is not None and self._read == len(self._events)

    def __iter__(self) -> Iterator[Event]:
        """Yield the unread events, blocking for new ones, up to the `DoneEvent`."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._read < len(self._events) or self._drained())
                if self._drained():
                    return
            event = self._next_unread()
            yield event
            if isinstance(event, DoneEvent):
                return

    async def __aiter__(self) -> AsyncIterator[Event]:
        """Like `__iter__`, awaiting instead of blocking the event loop."""
        flag = asyncio.Event()
        entry = (asyncio.get_running_loop(), flag)
        with self._cond:
            self._wakeups.append(entry)
        try:
            while True:
                event = self._next_unread()
                if event is None:
                    with self._cond:
                        if self._drained():
                            return
                    await flag.wait()
                    flag.clear()  # then re-check: a push after this sets the flag again
                    continue
                yield event
                if isinstance(event, DoneEvent):
                    return
        finally:
            with self._cond:
                self._wakeups.remove(entry)
