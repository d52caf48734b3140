"""Where streamed text goes: `codectx/stream` always, `$/progress` when the client can show it."""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from lsprotocol import types

logger = logging.getLogger(__name__)

STREAM_METHOD = "codectx/stream"
_tokens = itertools.count(1)


class TextStream:
    """Sends text deltas of one request to the client.

    Args:
        server: The language server (for `protocol.notify` and progress).
        request_id: The JSON-RPC id of the request being answered.
        kind: What streams ("ask", "explain", ...), echoed in notifications.
        progress: Also report through `$/progress` (client supports work-done progress).
        notify: Send `codectx/stream` notifications (False for progress-only work like loading).
        client_token: A `workDoneToken` the client sent with the request: progress
            goes there (no `window/workDoneProgress/create`), whatever `progress` says.
    """

    def __init__(self, server: Any, request_id: Any, kind: str, progress: bool, notify: bool = True,
                 client_token: Any = None) -> None:
        self.server = server
        self.notify = notify
        self.request_id = request_id
        self.kind = kind
        self.client_token = client_token is not None
        self.token: Any = client_token if self.client_token else (
            f"codectx-{kind}-{next(_tokens)}" if progress else None)
        self.index = 0
        self.begun = False  # a progress is ended only once it has begun
        self.percentage = 0  # $/progress percentages never go back (a tool round prefills again)

    async def begin(self, title: str, cancellable: bool = True) -> None:
        """Creates (unless the client did) and begins the progress; a cancellable one's cancel
        cancels the current task."""
        if self.token is None:
            return
        if not self.client_token:
            try:
                await self.server.work_done_progress.create_async(self.token)
            except Exception as err:  # noqa: BLE001 - a client may refuse; streaming still works
                logger.info("client refused progress token: %s", err)
                self.token = None
                return
        # A begin with a percentage tells the client to show the reports' percentages (LSP).
        self.server.work_done_progress.begin(
            self.token, types.WorkDoneProgressBegin(title=title, cancellable=cancellable, percentage=0))
        self.begun = True
        task = asyncio.current_task()
        if task is not None and cancellable:
            self.server.protocol.link_progress_cancel(self.token, task)

    def send(self, text: str) -> None:
        """Streams one delta."""
        if self.notify:
            self.server.protocol.notify(STREAM_METHOD, {
                "requestId": self.request_id, "kind": self.kind, "index": self.index, "text": text, "done": False})
        self.index += 1
        if self.token is not None:
            self.server.work_done_progress.report(self.token, types.WorkDoneProgressReport(message=text))

    def stage(self, message: str) -> None:
        """Reports a step of a multi-step job (loading) through `$/progress`."""
        if self.token is not None:
            self.server.work_done_progress.report(self.token, types.WorkDoneProgressReport(message=message))

    def prefill(self, done: int, total: int) -> None:
        """Reports prefill progress (tokens and a percentage) through `$/progress`."""
        if self.token is not None and total:
            self.percentage = max(self.percentage, min(100, 100 * done // total))
            self.server.work_done_progress.report(self.token, types.WorkDoneProgressReport(
                message=f"reading the repository: {done}/{total} tokens", percentage=self.percentage))

    def end(self, reason: str) -> None:
        """Sends the final notification and ends the progress."""
        if self.notify:
            self.server.protocol.notify(STREAM_METHOD, {
                "requestId": self.request_id, "kind": self.kind, "index": self.index, "text": "",
                "done": True, "finishReason": reason})
        if self.token is not None and self.begun:
            self.server.protocol.end_progress(self.token, reason)
