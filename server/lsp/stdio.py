"""The language server on stdin/stdout, with our framing and LSP's exit codes.

Replaces pygls' `start_io`, whose reader loop cannot recover from a bad frame
(see `framing`) and whose `exit` raised SystemExit inside a handler, which its
own loop swallowed: the process always ended with status 0.

A daemon thread reads stdin (a blocked read never holds up the exit) and feeds
`FrameParser`; the event loop hands each message to `CodectxProtocol.receive`.
At most `_QUEUED` parsed messages wait for the loop, so a client that writes
faster than the server reads is slowed down (its pipe fills) instead of filling memory.

The process ends on `exit` (status 0 after `shutdown`, 1 without) or at end of
input (the same statuses: end of input counts as `exit`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from typing import Any, BinaryIO

from pygls.io_ import StdoutWriter

from .errors import ParseError
from .framing import FrameParser, Message

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024
_QUEUED = 4  # decoded messages waiting for the loop: at most 4 x 64 MiB bodies in memory
_END = object()  # end of input


def serve_stdio(server: Any, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    """Runs `server` (a pygls server with a `CodectxProtocol`) until `exit` or end of input.

    Returns:
        The exit status: 0 if `shutdown` came before the end, 1 otherwise.
    """
    protocol = server.protocol
    protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    try:
        return asyncio.run(_serve(protocol, stdin or sys.stdin.buffer))
    except BrokenPipeError:
        logger.error("the client closed the server's stdout; exiting")
        return 0 if protocol.exit_code == 0 else 1


async def _serve(protocol: Any, stdin: BinaryIO) -> int:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    slots = threading.Semaphore(_QUEUED)
    protocol.on_exit = lambda code: inbox.put_nowait(_END)
    threading.Thread(target=_read, args=(stdin, loop, inbox, slots), name="codectx-stdin", daemon=True).start()
    while protocol.exit_code is None:
        event = await inbox.get()
        if event is _END:
            break
        slots.release()
        try:
            if isinstance(event, Message):
                protocol.receive(event.data)
            else:
                protocol.reply_error(None, ParseError(event.reason))
        except BrokenPipeError:
            raise
        except Exception:  # noqa: BLE001 - one bad message must not end the server
            logger.exception("could not handle a message")
    return protocol.finish()


def _read(stdin: BinaryIO, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue,
          slots: threading.Semaphore) -> None:
    """Reader thread: stdin -> parsed frames -> the loop's inbox, then `_END`."""
    parser = FrameParser()
    read = _reader(stdin)
    try:
        while chunk := read(_CHUNK):
            for event in parser.feed(chunk):
                slots.acquire()
                loop.call_soon_threadsafe(inbox.put_nowait, event)
        parser.end()
    except RuntimeError:  # the loop is closed: the server has already exited
        return
    except (OSError, ValueError) as err:
        logger.error("reading stdin failed: %s", err)
    try:
        loop.call_soon_threadsafe(inbox.put_nowait, _END)
    except RuntimeError:
        pass


def _reader(stdin: BinaryIO):
    """A blocking read of up to n bytes. On a real file descriptor it bypasses the
    buffered object: a daemon thread blocked inside BufferedReader holds its lock, and
    interpreter shutdown aborts when it cannot take that lock."""
    try:
        fd = stdin.fileno()
    except (AttributeError, OSError, ValueError):
        return getattr(stdin, "read1", stdin.read)
    return lambda size: os.read(fd, size)
