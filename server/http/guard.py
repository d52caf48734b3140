"""Host and Origin checks, so web pages cannot use the local API through a browser.

* **Host** (DNS rebinding): a page on ``attacker.example`` whose name later
  resolves to 127.0.0.1 reaches this server with ``Host: attacker.example``.
  Only loopback names, the bound address and names the user allowed
  (``--allow-host``) are served; when bound to every interface (which needs an
  API key) any IP literal is too, since rebinding needs a name.
* **Origin**: a browser sends ``Origin`` on cross-origin requests (and on every
  POST). It must be this server's own origin (the ``Host`` it was reached by:
  /monitor's requests) or one the user allowed (``--allow-origin``); a request
  without ``Origin`` that the browser marks ``Sec-Fetch-Site: cross-site`` or
  ``same-site`` is refused too, except a plain navigation (a link to /monitor).
* **CORS**: only allowed origins get ``Access-Control-Allow-Origin`` and an
  answer to their preflight; a foreign preflight gets 403 and no allowance.
"""
from __future__ import annotations

from typing import Callable
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import (WILDCARD_HOSTS, HttpConfig, is_ip_literal, is_loopback, normalize_host_name,
                     normalize_origin)
from .errors import BadRequestError, ForbiddenError, HttpError, error_response

PREFLIGHT_HEADERS = [(b"access-control-allow-methods", b"GET, POST"),
                     (b"access-control-allow-headers", b"authorization, content-type"),
                     (b"access-control-max-age", b"600")]


def split_host(value: str) -> tuple[str, int | None]:
    """``Host`` header -> (lower-case name without brackets or trailing dot, port or None)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, sep, port = value.rpartition(":")
        if not sep or ":" in name:
            name, port = value, ""
    return name.rstrip("."), int(port) if port.isdigit() and len(port) <= 5 else None


class RequestGuard:
    """ASGI middleware that refuses foreign Host names and browser origins (403, OpenAI error body).

    Args:
        app: The wrapped ASGI app.
        config: The allowed names and origins, and the bound address.
        on_refused: Called with the error code of each refused request (for /metrics).
    """

    def __init__(self, app: ASGIApp, config: HttpConfig, on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.on_refused = on_refused
        self.hosts = frozenset(normalize_host_name(h) for h in (*config.allowed_hosts, config.host)
                               if h not in WILDCARD_HOSTS)
        self.any_ip = config.host in WILDCARD_HOSTS
        self.origins = frozenset(normalize_origin(o) for o in config.allowed_origins)

    def host_allowed(self, name: str) -> bool:
        """True for loopback names, the bound address, allowed names (and IP literals on a wildcard bind)."""
        return is_loopback(name) or name in self.hosts or (self.any_ip and is_ip_literal(name))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or [] if k in _READ}
        refusal, cors = self._check(scope["method"], headers)
        if refusal is not None:
            if self.on_refused is not None:
                self.on_refused(refusal.code or "refused")
            await error_response(refusal)(scope, receive, send)
        elif cors is not None and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await Response(status_code=204, headers=dict(_text(_cors_headers(cors) + PREFLIGHT_HEADERS)))(
                scope, receive, send)
        elif cors is not None:
            await self.app(scope, receive, _with_headers(send, _cors_headers(cors)))
        else:
            await self.app(scope, receive, send)

    def _check(self, method: str, headers: dict[str, str]) -> tuple[HttpError | None, str | None]:
        """(the error to answer with, or None; the origin to grant CORS to, or None)."""
        host = headers.get("host")
        if host is None:
            return BadRequestError("the request has no Host header", code="missing_host"), None
        name, port = split_host(host)
        if not self.host_allowed(name):
            return ForbiddenError(
                f"this server does not answer to the host name '{name[:100]}' (a guard against DNS "
                f"rebinding); if you reach it by that name, start it with --allow-host {name[:100]}",
                code="host_not_allowed"), None
        origin = headers.get("origin")
        if origin is not None:
            normalized = origin.strip().lower().rstrip("/")
            if normalized in self.origins:
                return None, origin.strip()
            if _same_origin(normalized, name, port):
                return None, None
            return ForbiddenError(
                f"requests from web pages at {origin[:100]} are refused; to let that page use this server, "
                f"start it with --allow-origin {origin[:100]}", code="origin_not_allowed"), None
        site = headers.get("sec-fetch-site", "")
        navigation = method == "GET" and headers.get("sec-fetch-mode") == "navigate"
        if site in ("cross-site", "same-site") and not navigation:
            return ForbiddenError("requests from other web pages are refused (Sec-Fetch-Site: "
                                  f"{site}); allow a page with --allow-origin", code="origin_not_allowed"), None
        return None, None


_READ = frozenset({b"host", b"origin", b"sec-fetch-site", b"sec-fetch-mode", b"access-control-request-method"})


def _same_origin(origin: str, name: str, port: int | None) -> bool:
    """True when `origin` is ``http://`` + the Host this request was sent to."""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port
    except ValueError:
        return False
    return parts.scheme == "http" and parts.hostname == name and (origin_port or 80) == (port or 80) \
        and not parts.path


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


def _text(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)
    return sending
