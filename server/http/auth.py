"""API-key check for every endpoint (ASGI middleware); where the key comes from is keys.py.

A key is accepted as ``Authorization: Bearer KEY`` (API clients) or as the
password of HTTP Basic auth (so a browser can open /monitor); comparison is
constant-time.
"""
from __future__ import annotations

import base64
import binascii
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import AuthError, error_response


def key_matches(authorization: str | None, key: str) -> bool:
    """True when the Authorization header carries `key` (Bearer, or Basic password)."""
    if not authorization:
        return False
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.encode("utf-8"), key.encode("utf-8"))


class ApiKeyMiddleware:
    """Answers 401 to any HTTP request without the right key.

    Args:
        app: The wrapped ASGI app.
        key: The API key.
    """

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            raw = headers.get(b"authorization")
            if not key_matches(raw.decode("latin-1") if raw else None, self.key):
                message = "missing API key" if raw is None else "invalid API key"
                await error_response(AuthError(message, code="invalid_api_key"))(scope, receive, send)
                return
        await self.app(scope, receive, send)

