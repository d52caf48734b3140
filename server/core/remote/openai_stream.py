"""One streamed completion from an OpenAI-compatible server (`POST {base}/completions`).

The prompt goes as text: every server named in docs/remote.md accepts it, and the same
prompt bytes give the same tokens, which is what the servers' prefix caches key on.
The answer comes back as server-sent events (`data: {...}` lines, `data: [DONE]` at the
end); with `stream_options.include_usage` the last event carries `usage`, whose
`prompt_tokens_details.cached_tokens` says how much of the prompt the server reused
(llama.cpp's server also sends `timings.cache_n`; either is read).

`CompletionStream.close()` may be called from another thread: it shuts the socket, the
reading thread's next read fails, and the server sees the client go away (the servers
stop generating for a closed connection; docs/remote.md says which were checked).
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlsplit

from engine.errors import EngineError


class RemoteEngineError(EngineError):
    """The remote engine could not be reached, refused the request or broke the stream."""


class UnreachableError(RemoteEngineError):
    """No connection to the server (refused, timed out, name not found)."""


class ServerAnswerError(RemoteEngineError):
    """The server was reached but its answer was an HTTP error or unreadable."""


@dataclass
class Usage:
    """What the server reported about the prompt (None: not reported)."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass
class Chunk:
    """One streamed event: new text, and the finish reason on the last text event."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


@dataclass
class Endpoint:
    """Where the server is and how to authenticate.

    Attributes:
        base_url: The API root, e.g. `http://127.0.0.1:8080/v1`.
        key: Sent as `Authorization: Bearer <key>` when not empty.
        timeout_s: Connect timeout and the longest silence while streaming.
    """

    base_url: str
    key: str = ""
    timeout_s: float = 60.0
    _parts: tuple[str, str, int, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RemoteEngineError(f"engine URL {self.base_url!r} is not an http(s) URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._parts = (parts.scheme, parts.hostname, port, parts.path)

    def connection(self) -> http.client.HTTPConnection:
        scheme, host, port, _ = self._parts
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        return kind(host, port, timeout=self.timeout_s)

    def path(self, name: str) -> str:
        return f"{self._parts[3]}/{name}"

    def root_path(self, path: str) -> str:
        """`path` on the server's root: the API path without a trailing `/v1`."""
        base = self._parts[3]
        return f"{base.removesuffix('/v1')}{path}"

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        return headers

    def get_json(self, name: str) -> dict:
        """`GET {base}/{name}` as JSON (e.g. `models`)."""
        return self._json("GET", self.path(name))

    def post_json(self, path: str, body: dict) -> dict:
        """`POST {server root}{path}` as JSON (the root: the API URL without its `/v1`; e.g. `/tokenize`)."""
        return self._json("POST", self.root_path(path), json.dumps(body).encode())

    def _json(self, method: str, url_path: str, body: bytes | None = None) -> dict:
        connection = self.connection()
        try:
            connection.request(method, url_path, body=body, headers=self.headers())
            response = connection.getresponse()
            raw = response.read()
        except OSError as err:
            raise UnreachableError(f"cannot reach the engine at {self.base_url}: {err}") from err
        finally:
            connection.close()
        if response.status != 200:
            raise ServerAnswerError(f"{method} {url_path}: HTTP {response.status}: {raw[:200]!r}")
        try:
            return json.loads(raw)
        except ValueError as err:
            raise ServerAnswerError(f"{method} {url_path} is not JSON: {raw[:200]!r}") from err


class CompletionStream:
    """The events of one streamed completion; iterate once, `close()` from anywhere."""

    def __init__(self, endpoint: Endpoint, body: dict) -> None:
        self.endpoint = endpoint
        self.body = dict(body, stream=True, stream_options={"include_usage": True})
        self._connection: http.client.HTTPConnection | None = None
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Ends the stream: the connection is shut, the server sees the client leave."""
        self._closed.set()
        connection = self._connection
        sock = getattr(connection, "sock", None) if connection is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __iter__(self) -> Iterator[Chunk]:
        connection = self._connection = self.endpoint.connection()
        try:
            try:
                connection.request("POST", self.endpoint.path("completions"), body=json.dumps(self.body).encode(),
                                   headers=self.endpoint.headers())
                response = connection.getresponse()
            except OSError as err:
                if self.closed:
                    return
                raise UnreachableError(f"cannot reach the engine at {self.endpoint.base_url}: {err}") from err
            if response.status != 200:
                detail = response.read(500).decode("utf-8", "replace")
                raise RemoteEngineError(f"the engine at {self.endpoint.base_url} answered HTTP {response.status}: "
                                        f"{detail}")
            yield from self._events(response)
        finally:
            connection.close()

    def _events(self, response: http.client.HTTPResponse) -> Iterator[Chunk]:
        while True:
            try:
                line = response.readline()
            except (OSError, http.client.HTTPException) as err:
                if self.closed:
                    return
                raise RemoteEngineError(f"the engine's stream broke: {err}") from err
            if not line:
                if self.closed:
                    return
                raise RemoteEngineError("the engine closed the stream before it ended")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            yield parse_event(json.loads(data))


def parse_event(event: dict) -> Chunk:
    """A `Chunk` from one decoded `data:` event."""
    if "error" in event:
        raise RemoteEngineError(f"the engine reported an error: {event['error']}")
    chunk = Chunk()
    choices = event.get("choices") or []
    if choices:
        chunk.text = choices[0].get("text") or ""
        chunk.finish_reason = choices[0].get("finish_reason")
    usage, timings = event.get("usage"), event.get("timings")
    if usage or timings:
        usage = usage or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        if cached is None and timings:
            cached = timings.get("cache_n")
        chunk.usage = Usage(usage.get("prompt_tokens"), cached, usage.get("completion_tokens"))
    return chunk
