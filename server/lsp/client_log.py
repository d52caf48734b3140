"""Log records to the client as `window/logMessage`, so stderr keeps only warnings and errors.

Editors treat a language server's stderr as trouble (Neovim writes every stderr line to
`lsp.log` as `[ERROR]`); the log itself belongs in the client's log view. Records logged
before `initialize` wait (LSP lets a server notify only from then on); records from other
threads (the engine's worker, the HTTP thread) are sent on the server's event loop.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any

from lsprotocol import types

_EARLY = 200  # records kept until `initialize`; older ones are dropped


def message_type(level: int) -> types.MessageType:
    """The LSP message type of a logging level."""
    if level >= logging.ERROR:
        return types.MessageType.Error
    if level >= logging.WARNING:
        return types.MessageType.Warning
    if level >= logging.INFO:
        return types.MessageType.Info
    return types.MessageType.Log


class ClientLogHandler(logging.Handler):
    """A logging handler that sends each record as `window/logMessage` through `server`.

    pygls' own records are not sent (sending one logs again), nor are records logged while
    one is being sent; a failed send is dropped, never raised into the code that logged.
    """

    def __init__(self, server: Any, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early: deque[types.LogMessageParams] = deque(maxlen=_EARLY)
        self._guard = threading.Lock()
        self._sending = threading.local()

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """From `initialize` on: send records on `loop`, the waiting ones first."""
        with self._guard:
            self._loop = loop
            early, self._early = list(self._early), deque(maxlen=_EARLY)
        for params in early:
            self._send(params)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("pygls") or getattr(self._sending, "active", False):
            return
        try:
            params = types.LogMessageParams(type=message_type(record.levelno), message=self.format(record))
        except Exception:  # noqa: BLE001 - a bad record must not break the caller
            self.handleError(record)
            return
        with self._guard:
            loop = self._loop
            if loop is None:
                self._early.append(params)
                return
        if _running_loop() is loop:
            self._send(params)
            return
        try:
            loop.call_soon_threadsafe(self._send, params)
        except RuntimeError:  # the loop is closed: the server is ending
            pass

    def _send(self, params: types.LogMessageParams) -> None:
        self._sending.active = True
        try:
            self.server.window_log_message(params)
        except Exception:  # noqa: BLE001 - the client is gone or the pipe broke: nothing to tell
            pass
        finally:
            self._sending.active = False


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
