"""`until_done`: a request handle's events, awaited, as every `Backend` runs them."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from engine.request import DoneEvent, TokenEvent


async def until_done(backend: Any, handle: Any, request_id: str,
                     on_text: Callable[[str], None] | None = None) -> DoneEvent:
    """`handle`'s `DoneEvent`, its text streamed to `on_text`; cancelling the awaiting task
    cancels the request on `backend`."""
    try:
        async for event in handle:
            if isinstance(event, TokenEvent):
                if on_text is not None and event.text:
                    on_text(event.text)
            elif isinstance(event, DoneEvent):
                return event
        raise RuntimeError(f"engine stream for {request_id} ended without DoneEvent")
    except asyncio.CancelledError:
        backend.cancel(request_id)
        raise
