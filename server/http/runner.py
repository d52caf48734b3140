"""`HttpServer`: uvicorn running the app on its own thread and event loop, or on the main thread.

The language server owns the main thread (stdio) and its own loop; the HTTP
side runs beside it and shares the engine, whose `submit`/`cancel` are
thread-safe. The listening socket is bound here (`bind_listener`), before
the model loads, so a port in use is one clear error at once; the "API on"
line is logged only once uvicorn serves on it, with the port it really got.
"""
from __future__ import annotations

import errno
import logging
import signal
import socket
import threading
from typing import Any

import uvicorn

from .config import WILDCARD_HOSTS, HttpConfig
from .connections import ConnectionLimits
from .log_limit import limited_logger

logger = logging.getLogger(__name__)
KERNEL_BACKLOG = 2048


class ListenError(OSError):
    """The address cannot be listened on (port in use, no such local address, no permission)."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), not yet listening (uvicorn starts that).

    Raises:
        ListenError: With a message that says what to change.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise ListenError(f"cannot listen on {host}: {err.strerror}; choose another address with --http") from err
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        reasons = {errno.EADDRINUSE: f"port {port} on {host} is in use",
                   errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
                   errno.EACCES: f"this user may not listen on port {port} on {host}"}
        reason = reasons.get(err.errno or 0, f"cannot listen on {host}:{port}: {err.strerror}")
        raise ListenError(f"{reason}; choose another with --http") from err
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server that logs where it listens, and flags it, once its socket serves."""

    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self.listening = threading.Event()
        self.url = url

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            # asyncio listened with `backlog`, which is also how many connections it accepts
            # per wake-up; a deeper kernel queue keeps a burst waiting there (no descriptors
            # of ours) instead of making clients retry their SYN a second later.
            for sock in sockets or ():
                sock.listen(KERNEL_BACKLOG)
            logger.info("codectx HTTP API on %s (monitor: %s/monitor)", self.url, self.url,
                        extra={"announce": True})  # on stderr beside the editor too
            self.listening.set()


class HttpServer:
    """Runs an ASGI app with uvicorn, with `GuardedH11Protocol`'s connection limits.

    Args:
        app: The ASGI app (`create_app`).
        host: Address to bind.
        port: Port to bind (0 picks a free one; see `port`).
        config: Connection limits and timeouts (defaults: `HttpConfig()`'s).
        sock: A socket from `bind_listener` to serve on instead of binding here.

    Raises:
        ListenError: The address cannot be bound.
    """

    def __init__(self, app: Any, host: str, port: int, config: HttpConfig | None = None,
                 sock: socket.socket | None = None) -> None:
        config = config or HttpConfig()
        self.host = host
        self._sock = sock or bind_listener(host, port)
        limits = ConnectionLimits(config.max_connections, config.idle_timeout_s, config.request_timeout_s)
        limited_logger("uvicorn.error")  # uvicorn warns once per malformed request
        # log_config=None: uvicorn logs through our handlers (stderr), never to stdout (the LSP channel).
        # backlog: asyncio accepts at most this many connections per wake-up, which bounds
        # the refused ones open at once (the kernel queue is then deepened, see _Server).
        uv_config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", ws="none",
                                   http=limits.protocol_factory(), timeout_keep_alive=config.idle_timeout_s,
                                   backlog=config.max_connections, timeout_graceful_shutdown=2)
        self.limits = limits
        self._server = _Server(uv_config, self.url)
        self._thread = threading.Thread(target=self._serve, name="codectx-http", daemon=True)

    def _serve(self) -> None:
        self._server.run(sockets=[self._sock])

    def start(self, timeout: float = 30.0) -> None:
        """Start serving on a background thread; returns once the socket listens.

        Raises:
            RuntimeError: uvicorn did not start.
        """
        self._thread.start()
        while not self._server.listening.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError(f"the HTTP server did not start on {self.url}")
            timeout -= 0.05
            if timeout <= 0:
                raise RuntimeError("the HTTP server did not start in time")

    @property
    def port(self) -> int:
        """The bound port."""
        return self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        """Where a client on this machine reaches the server."""
        host = "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for its thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._sock.close()

    def run(self) -> None:
        """Serve on the calling (main) thread until Ctrl-C or SIGTERM, then return.

        uvicorn shuts down gracefully on those signals and then raises them
        again; the handlers installed here turn that into a normal return, so
        the caller can close the engine (and flush its archive).
        """
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._serve()
        except _Stopped:
            pass
        finally:
            self._sock.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _Stopped(Exception):
    """Raised by `_stop` once uvicorn has shut down on a signal."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped(signum)
