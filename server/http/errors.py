"""HTTP errors and the one place that maps every error to an OpenAI-style JSON body.

Handlers raise `HttpError`s (or let `EngineError`s, `ContextError`s and the core's
errors through, which take the status of their core category); `error_response`
turns each into ``{"error": {"message", "type", "code", "param"}}`` with a status
code a client can act on.
"""
from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from server.core.errors import Category, classify

logger = logging.getLogger(__name__)


class HttpError(Exception):
    """Base class of errors the HTTP side answers with a 4xx/5xx status.

    Args:
        message: What went wrong, for a person.
        param: The request field at fault, if one is.
        code: A short machine-readable code (OpenAI's `error.code`).
    """

    status = 500
    kind = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class BadRequestError(HttpError):
    """Malformed JSON or a field of the wrong shape (400)."""

    status = 400
    kind = "invalid_request_error"


class ContextLengthError(BadRequestError):
    """A prompt longer than the server accepts (400, code `context_length_exceeded`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="messages", code="context_length_exceeded")


class AuthError(HttpError):
    """A missing or wrong API key (401)."""

    status = 401
    kind = "authentication_error"


class ForbiddenError(HttpError):
    """A request from a host name or browser origin this server does not serve (403)."""

    status = 403
    kind = "invalid_request_error"


class ModelNotFoundError(HttpError):
    """A `model` this server does not serve (404)."""

    status = 404
    kind = "invalid_request_error"


class PayloadTooLargeError(HttpError):
    """A request body over the size limit (413)."""

    status = 413
    kind = "invalid_request_error"


class UnsupportedMediaTypeError(HttpError):
    """A request body that is not declared as JSON (415)."""

    status = 415
    kind = "invalid_request_error"


class ClientGoneError(HttpError):
    """The client closed the connection or was cut off before its request arrived (nobody reads this)."""

    status = 400
    kind = "invalid_request_error"


class NotReadyError(HttpError):
    """The model is still loading (503)."""

    status = 503
    kind = "server_error"


_STATUSES: dict[Category, tuple[type[HttpError], str]] = {
    Category.NOT_READY: (NotReadyError, "model_loading"),
    Category.ENGINE_CLOSED: (NotReadyError, "engine_closed"),
    Category.CONTEXT_FAILED: (BadRequestError, "bad_prompt"),
    Category.INVALID_ARGUMENTS: (BadRequestError, "invalid_arguments"),
    Category.CANCELLED: (HttpError, "engine_error"),
    Category.MODEL_NOT_FOUND: (HttpError, "engine_error"),
    Category.MODEL_LOAD_FAILED: (HttpError, "engine_error"),
    Category.ENGINE_FAILED: (HttpError, "engine_error"),
    Category.INTERNAL: (HttpError, "internal_error"),
}
"""The HTTP status class and code of each core error category (`server.core.errors`)."""


def to_http_error(err: BaseException) -> HttpError:
    """The `HttpError` a client receives for `err`: an `HttpError` as raised, anything else
    by its core category, with the core's message."""
    if isinstance(err, HttpError):
        return err
    if isinstance(err, ClientDisconnect):
        return ClientGoneError("the client disconnected before sending the whole request", code="client_closed")
    failure = classify(err)
    if failure.category is Category.INTERNAL:
        logger.error("unexpected error", exc_info=err)
    kind, code = _STATUSES[failure.category]
    param = "messages" if failure.category is Category.CONTEXT_FAILED else None
    return kind(failure.message, param=param, code=code)


def error_body(err: HttpError) -> dict:
    """OpenAI's error object for `err`."""
    return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}


def error_response(err: BaseException) -> JSONResponse:
    """A JSON response for any error (status from `to_http_error`)."""
    http = to_http_error(err)
    headers = {"WWW-Authenticate": 'Bearer realm="codectx", Basic realm="codectx"'} \
        if isinstance(http, AuthError) else None
    return JSONResponse(error_body(http), status_code=http.status, headers=headers)
