"""One submitted engine request as seen from the event loop.

A task reads the handle's events as they come, keeps the monitor's tracker
current and records the final metrics, whether or not anyone still listens:
a client that disconnects cancels the engine request (which rolls back to its
last confirmed checkpoint) and the cancelled `DoneEvent` is still recorded.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from starlette.types import Receive

from engine.request import DoneEvent, Event, TokenEvent

from .activity import Activity, Tracked

logger = logging.getLogger(__name__)


class Generation:
    """Events of one engine request, pumped into a queue by a task.

    Args:
        handle: The engine's `RequestHandle`.
        tracked: The monitor's tracker for it.
        activity: Where the final metrics go.
    """

    def __init__(self, handle: Any, tracked: Tracked, activity: Activity) -> None:
        self.handle = handle
        self.tracked = tracked
        self.activity = activity
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self.done: asyncio.Future[DoneEvent] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        async for event in self.handle:
            if isinstance(event, TokenEvent):
                self.tracked.on_tokens(len(event.token_ids))
            else:
                self.activity.finish(self.tracked, event)
                self.done.set_result(event)
            self._queue.put_nowait(event)

    async def events(self) -> AsyncIterator[Event]:
        """The request's events, ending with its `DoneEvent`."""
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, DoneEvent):
                return

    def cancel(self) -> None:
        """Ask the engine to stop (no-op once the request has ended)."""
        if not self.handle.done:
            logger.info("cancelling %s", self.tracked.request_id)
            self.handle.cancel()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def result_unless_disconnected(generation: Generation, receive: Receive) -> DoneEvent:
    """The request's `DoneEvent`; a client disconnect first cancels the request.

    Call only after the request body has been read: `receive` then yields
    nothing but the disconnect.
    """
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({generation.done, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not generation.done.done():
            generation.cancel()
        return await generation.done
    finally:
        watcher.cancel()
