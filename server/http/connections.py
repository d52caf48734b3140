"""Connection-level limits that uvicorn's h11 protocol lacks: a cap, idle and request timeouts.

uvicorn (0.55) closes a keep-alive connection that stays silent after a
response, but a connection that never sends anything, or sends its request
headers one byte at a time, is kept forever, and ``limit_concurrency`` still
accepts every connection. `GuardedH11Protocol` adds:

* a **cap**: past `ConnectionLimits.max_connections` open connections, a new
  one gets a ``503`` JSON error and is closed (it lingers at most
  `LINGER_S` for the client to read it; beyond as many lingering ones as the
  cap, new ones are reset at once), so file descriptors stay bounded;
* an **idle timeout**: a connection that sends nothing while no request is in
  progress is closed after ``idle_timeout_s`` (uvicorn's keep-alive timer is
  set to the same value);
* a **request timeout**: from a request's first byte, the client has
  ``request_timeout_s`` to send all of it, headers and body, or gets ``408``;
* JSON bodies for the protocol's own ``400`` (malformed HTTP, missing Host).

Warnings about refused and timed-out clients go through a rate-limited logger.
"""
from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .log_limit import limited_logger

logger = limited_logger(__name__)
LINGER_S = 1.0
BAD_HTTP = ("invalid HTTP request: a malformed request line or header, headers over 16 KiB, or an HTTP/1.1 "
            "request without a Host header")


def raw_error(status: int, reason: str, message: str, code: str, kind: str = "invalid_request_error",
              extra: tuple[str, ...] = ()) -> bytes:
    """A complete HTTP/1.1 response carrying an OpenAI-style error, then ``Connection: close``."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Connection: close", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class ConnectionLimits:
    """Limits shared by every connection of one server, and the connections refused for now.

    Attributes:
        max_connections: Connections served at once.
        idle_timeout_s: Silence allowed while no request is in progress.
        request_timeout_s: Time allowed to send one whole request.
        lingering: Refused connections still open for their 503 to be read.
    """

    max_connections: int = 64
    idle_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    lingering: set[Any] = field(default_factory=set)

    def protocol_factory(self) -> Callable[..., GuardedH11Protocol]:
        """What uvicorn's ``Config(http=...)`` takes: builds a protocol bound to these limits."""
        return functools.partial(GuardedH11Protocol, limits=self)

    def refuse(self, transport: asyncio.Transport, open_connections: int) -> None:
        """Answer 503 and close (after `LINGER_S` for the client to read it, or at once past the cap)."""
        logger.warning("refused a connection: %d are open, the limit is %d (--max-connections)",
                       open_connections, self.max_connections)
        if len(self.lingering) >= self.max_connections:
            transport.abort()
            return
        transport.write(raw_error(
            503, "Service Unavailable", f"too many open connections (the limit is {self.max_connections}); "
            "try again in a moment", "too_many_connections", "server_error", ("Retry-After: 1",)))
        transport.write_eof()
        self.lingering.add(transport)
        asyncio.get_running_loop().call_later(LINGER_S, self.release, transport)

    def release(self, transport: asyncio.Transport) -> None:
        """Close a refused connection for good."""
        if transport in self.lingering:
            self.lingering.discard(transport)
            transport.abort()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with `ConnectionLimits` applied (see the module docstring).

    Args:
        limits: The limits shared by the server's connections.
        **kwargs: What uvicorn passes (config, server_state, app_state, _loop).
    """

    def __init__(self, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limits = limits
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._refused = True
            self.transport = transport
            self.limits.refuse(transport, len(self.connections))
            return
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped, so closing later sends FIN rather than a reset
        super().data_received(data)
        self._follow()

    def eof_received(self) -> bool | None:
        if self._refused:
            self.limits.release(self.transport)
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refused:
            self.limits.lingering.discard(self.transport)
            return
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def send_400_response(self, msg: str) -> None:
        self.transport.write(raw_error(400, "Bad Request", BAD_HTTP, "invalid_http"))
        self.transport.close()

    def _follow(self) -> None:
        """Keep the one timer that fits the connection's state.

        A request partly received runs the request timer (from its first byte,
        never extended); a connection between requests runs the idle timer; a
        whole request being answered runs none.
        """
        if self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0]):
            want, delay = "request", self.limits.request_timeout_s
        elif state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            want, delay = "idle", self.limits.idle_timeout_s
        else:
            want, delay = "", 0.0
        if want != self._timer_kind:
            self._disarm()
            if want:
                self._arm(want, delay)

    def _arm(self, kind: str, delay: float) -> None:
        self._timer_kind = kind
        self._timer = self.loop.call_later(delay, self._expired, kind)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_kind = None, ""

    def _expired(self, kind: str) -> None:
        self._timer, self._timer_kind = None, ""
        if self.transport.is_closing():
            return
        if kind == "request":
            logger.warning("closed a connection from %s that took over %g s to send its request",
                           _peer(self.client), self.limits.request_timeout_s)
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(raw_error(
                    408, "Request Timeout", f"the request was not received within "
                    f"{self.limits.request_timeout_s:g} s", "request_timeout"))
        self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"
