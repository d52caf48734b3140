"""LSP base-protocol framing: bytes in, decoded JSON messages out, with resynchronisation.

A frame is a header block (`Name: value` lines, each ending in CRLF, then an
empty line) and a body of exactly `Content-Length` bytes of UTF-8 JSON. pygls'
reader trusts every frame: a wrong Content-Length glues the next header to a
body, and after that no header line is ever recognised again; an absurd one is
allocated. `FrameParser` instead treats a frame it cannot take as *broken*:

* a header line that is not `Name: value`, longer than `MAX_HEADER_LINE`, a
  header block with more than `MAX_HEADER_LINES` lines or without a numeric
  Content-Length;
* a Content-Length above `MAX_CONTENT_LENGTH` (the body is never allocated);
* a body that is not UTF-8 JSON (Content-Length too short or too long);
* a body still incomplete while the next frame's header has already arrived
  inside it (Content-Length too long: waiting for the missing bytes would
  stall a client that waits for the answer).

A broken frame is logged and reported (`BrokenFrame`: the transport answers it
with -32700 and id null), then the parser scans for the next
`Content-Length:` header, starting one byte after where the broken frame
started, so a header that ended up inside a broken body is still found.
Scanning keeps only the last few bytes, so memory stays bounded whatever comes.
A valid JSON body cannot contain a `Content-Length: N` line (JSON strings hold
no raw line breaks), so the scan cannot lock on to text inside a message.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# The largest body accepted. VS Code syncs buffers up to 50 MB to language servers;
# JSON escaping adds a little. Above this a frame is skipped without being read into memory.
MAX_CONTENT_LENGTH = 64 * 1024 * 1024
MAX_HEADER_LINE = 1024  # LSP defines two short headers; anything longer is not a header
MAX_HEADER_LINES = 16

_MARKER = b"Content-Length:"
_HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
# A complete Content-Length line: inside a pending body it proves the body is too short.
_HEADER_INSIDE = re.compile(rb"Content-Length:[ \t]{0,8}[0-9]{1,20}[ \t]{0,8}\r?\n")
_PROBE_OVERLAP = 64  # bytes re-searched at each feed, so a header split across reads is found


@dataclass(frozen=True)
class Message:
    """A well-framed body, decoded from JSON (any JSON value)."""

    data: Any


@dataclass(frozen=True)
class BrokenFrame:
    """A frame that was dropped, and why."""

    reason: str


class _Broken(Exception):
    """The frame at the start of the buffer cannot be taken."""


class FrameParser:
    """Incremental parser: `feed` it bytes as they arrive, in any pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._length: int | None = None  # body length once a header block was read
        self._probe = 0  # where the next search for a header inside the pending body starts
        self._scanning = False
        self._skipped = 0

    def feed(self, data: bytes) -> list[Message | BrokenFrame]:
        """Consumes `data`; returns the messages and broken frames completed by it, in order."""
        self._buffer += data
        events: list[Message | BrokenFrame] = []
        while True:
            if self._scanning and not self._scan():
                return events
            try:
                event = self._body() if self._length is not None else self._headers()
            except _Broken as err:
                events.append(self._broken(str(err)))
                continue
            if event is None:
                return events
            events.append(event)

    def end(self) -> None:
        """Input ended: logs a frame left incomplete."""
        pending = bytes(self._buffer).strip()
        if self._length is not None or (pending and not self._scanning):
            logger.error("input ended inside a message (%d bytes of it received)", len(self._buffer))

    def _scan(self) -> bool:
        """Drops bytes up to the next Content-Length header; False if none has arrived yet."""
        found = self._buffer.find(_MARKER)
        if found < 0:
            keep = len(_MARKER) - 1
            drop = max(0, len(self._buffer) - keep)
            self._skipped += drop
            del self._buffer[:drop]
            return False
        self._skipped += found
        del self._buffer[:found]
        logger.warning("resynchronised on a Content-Length header after skipping %d bytes", self._skipped)
        self._scanning, self._skipped = False, 0
        return True

    def _broken(self, reason: str) -> BrokenFrame:
        """Starts scanning one byte after the broken frame's start."""
        logger.error("LSP framing error: %s; skipping to the next Content-Length header", reason)
        del self._buffer[:1]
        self._skipped, self._scanning = 1, True
        self._length, self._probe = None, 0
        return BrokenFrame(reason)

    def _headers(self) -> Message | None:
        """Reads a complete header block at the buffer's start, then the body if it is there.

        Raises:
            _Broken: The block is malformed or announces too large a body.
        """
        buffer, position, length, count = self._buffer, 0, None, 0
        while True:
            newline = buffer.find(b"\n", position, position + MAX_HEADER_LINE + 1)
            if newline < 0:
                if len(buffer) - position > MAX_HEADER_LINE:
                    raise _Broken(f"a header line longer than {MAX_HEADER_LINE} bytes")
                return None
            line = bytes(buffer[position:newline]).rstrip(b"\r")
            position = newline + 1
            if not line:
                if count == 0:  # stray blank lines between frames are harmless
                    del buffer[:position]
                    position = 0
                    continue
                break
            count += 1
            if count > MAX_HEADER_LINES:
                raise _Broken(f"more than {MAX_HEADER_LINES} header lines")
            name, colon, value = line.partition(b":")
            if not colon or not _HEADER_NAME.fullmatch(name):
                raise _Broken(f"not a 'Name: value' header line: {line[:60]!r}")
            if name.lower() == b"content-length":
                length = _content_length(value.strip(), length)
        if length is None:
            raise _Broken("a header block without Content-Length")
        if length > MAX_CONTENT_LENGTH:
            raise _Broken(f"Content-Length {length} is over the limit of {MAX_CONTENT_LENGTH} bytes")
        del buffer[:position]
        self._length, self._probe = length, 0
        return self._body()

    def _body(self) -> Message | None:
        """The body once complete, decoded.

        Raises:
            _Broken: The body is not UTF-8 JSON, or the next header arrived inside it.
        """
        buffer, length = self._buffer, self._length
        if len(buffer) < length:
            if _HEADER_INSIDE.search(buffer, self._probe):
                raise _Broken(f"Content-Length {length} is longer than the message: "
                              "the next header arrived inside its body")
            self._probe = max(0, len(buffer) - _PROBE_OVERLAP)
            return None
        body = bytes(buffer[:length])
        try:
            data = json.loads(body.decode("utf-8"))
        except (ValueError, RecursionError) as err:
            raise _Broken(f"a body of {length} bytes that is not UTF-8 JSON "
                          f"({type(err).__name__}: {str(err)[:80]})") from err
        del buffer[:length]
        self._length = None
        return Message(data)


def _content_length(value: bytes, seen: int | None) -> int:
    """A Content-Length header's value.

    Raises:
        _Broken: Not a decimal number, or a second, different one.
    """
    if not value.isdigit() or len(value) > 20:
        raise _Broken(f"Content-Length is not a number: {value[:40]!r}")
    length = int(value)
    if seen is not None and seen != length:
        raise _Broken(f"two different Content-Length headers ({seen}, {length})")
    return length
