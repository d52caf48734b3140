"""`create_app`: the Starlette app with every route, the error map and the key check."""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .activity import Activity
from .auth import ApiKeyMiddleware
from .completions import ChatService
from .config import HttpConfig
from .errors import HttpError, NotReadyError, error_response
from .guard import RequestGuard
from .monitor import Monitor
from .source import EngineSource

logger = logging.getLogger(__name__)
Endpoint = Callable[[Request], Awaitable[Response]]


def _guarded(endpoint: Endpoint) -> Endpoint:
    """Every error leaves as an OpenAI-style JSON error."""
    async def call(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as err:  # noqa: BLE001 - mapped in one place
            if not isinstance(err, HttpError):
                logger.debug("request to %s failed", request.url.path, exc_info=err)
            return error_response(err)
    return call


class _RouteError(HttpError):
    """Starlette's routing errors (unknown path 404, method 405) in the OpenAI error shape."""

    kind = "invalid_request_error"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, code={404: "not_found", 405: "method_not_allowed"}.get(status))
        self.status = status


async def _route_error(request: Request, exc: Exception) -> Response:
    status, detail = getattr(exc, "status_code", 500), getattr(exc, "detail", "error")
    return error_response(_RouteError(status, f"{detail}: {request.method} {request.url.path[:200]}"))


def create_app(source: EngineSource, config: HttpConfig = HttpConfig()) -> Any:
    """The ASGI app: OpenAI routes, /health, /metrics and /monitor, behind the
    Host/Origin guard (outermost, so a refused page learns nothing) and the key check.

    Args:
        source: Where the engine comes from.
        config: Limits, allowed hosts and origins, and the API key (validated here).

    Raises:
        HttpConfigError: A non-loopback address without an API key, or bad limits.
    """
    config.validate()
    def count(finish_reason: str) -> None:
        outcomes = source.outcomes()
        if outcomes is not None:
            outcomes.record("http", finish_reason)

    def outcomes() -> dict:
        counted = source.outcomes()
        return counted.snapshot() if counted is not None else {}

    activity = Activity(config.recent_requests, count)

    def engine_stats() -> dict | None:
        served = source.current()
        return served.backend.stats() if served is not None else None

    def model_id() -> str | None:
        served = source.current()
        return served.model_id if served is not None else None

    chat = ChatService(source, config, activity)
    monitor = Monitor(activity, engine_stats, model_id, outcomes)

    async def health(request: Request) -> Response:
        served = source.current()
        if served is None:
            raise NotReadyError("the model is still loading", code="model_loading")
        return JSONResponse({"status": "ok", "model": served.model_id,
                             "repository": served.has_repository, "active_requests": len(activity.active)})

    routes = [
        Route("/health", _guarded(health), methods=["GET"]),
        Route("/metrics", _guarded(monitor.metrics), methods=["GET"]),
        Route("/monitor", _guarded(monitor.page), methods=["GET"]),
        Route("/monitor/state", _guarded(monitor.state_endpoint), methods=["GET"]),
        Route("/v1/models", _guarded(chat.models), methods=["GET"]),
        Route("/v1/chat/completions", _guarded(chat.chat_completions), methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _route_error})
    inner: Any = ApiKeyMiddleware(app, key=config.api_key) if config.api_key else app
    return RequestGuard(inner, config, activity.refuse)
