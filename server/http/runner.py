"""`HttpServer`: uvicorn running the app on its own thread and event loop.

The language server owns the main thread (stdio) and its own loop; the HTTP
side runs beside it and shares the engine, whose `submit`/`cancel` are
thread-safe.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import uvicorn

logger = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn's server with a flag set once its sockets listen."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = threading.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class HttpServer:
    """Runs an ASGI app with uvicorn on a background thread.

    Args:
        app: The ASGI app (`create_app`).
        host: Address to bind.
        port: Port to bind (0 picks a free one; see `port` after `start`).
    """

    def __init__(self, app: Any, host: str, port: int) -> None:
        # log_config=None: uvicorn logs through our handlers (stderr), never to stdout (the LSP channel).
        config = uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False,
                                lifespan="off", timeout_graceful_shutdown=2)
        self._server = _Server(config)
        self._thread = threading.Thread(target=self._server.run, name="codectx-http", daemon=True)
        self.host = host

    def start(self, timeout: float = 30.0) -> None:
        """Start listening; returns once the socket is bound.

        Raises:
            RuntimeError: uvicorn did not start (port in use, bad address).
        """
        self._thread.start()
        while not self._server.listening.wait(0.05):
            if not self._thread.is_alive():
                raise RuntimeError(f"the HTTP server did not start on {self.host}")
            timeout -= 0.05
            if timeout <= 0:
                raise RuntimeError("the HTTP server did not start in time")
        logger.info("HTTP API on %s", self.url)

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for its thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def run(self) -> None:
        """Serve on the calling (main) thread until Ctrl-C or SIGTERM, then return.

        uvicorn shuts down gracefully on those signals and then raises them
        again; the handlers installed here turn that into a normal return, so
        the caller can close the engine (and flush its archive).
        """
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._server.run()
        except _Stopped:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _Stopped(Exception):
    """Raised by `_stop` once uvicorn has shut down on a signal."""


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped(signum)
