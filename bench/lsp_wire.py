"""LSP's base protocol on a byte stream, written by hand so that tests and the soak can send what a client library
would refuse to (malformed frames, bodies that are not JSON) and read every message the server writes."""
from __future__ import annotations

import asyncio
import json
from typing import Any


def frame(payload: Any) -> bytes:
    """`payload` as one well-formed LSP frame (bytes are sent as the body as they are)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


async def read_message(stream: asyncio.StreamReader) -> dict | None:
    """The next message on `stream`; None at its end or after a header block without a Content-Length.

    Raises:
        asyncio.IncompleteReadError: The stream ended inside a body.
    """
    length = None
    while (line := await stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("ascii").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    if not line or length is None:
        return None
    return json.loads(await stream.readexactly(length))
