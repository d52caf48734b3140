"""LSP errors, and the one place that maps every error to JSON-RPC.

Handlers raise or let through `EngineError`s, context errors, the core's errors
(`server.core.errors`) and the LSP errors below; `to_rpc_error` turns each into a
JSON-RPC error: the code from the error's core category, the core's user message.
"""
from __future__ import annotations

import logging

from pygls.exceptions import JsonRpcException, JsonRpcInternalError

from server.core.errors import Category, CoreError, InvalidArgumentsError, NotReadyError, classify

logger = logging.getLogger(__name__)

__all__ = ["InvalidArgumentsError", "NotReadyError", "to_rpc_error", "user_message"]

# codectx's own codes lie outside JSON-RPC's reserved -32768..-32000, where LSP defines -32001
# (UnknownErrorCode) and -32002 (ServerNotInitialized): a client can tell each of ours from those.
MODEL_NOT_FOUND = -31001
MODEL_LOAD_FAILED = -31002
NOT_READY = -31003
CONTEXT_FAILED = -31004
ENGINE_CLOSED = -31005
REQUEST_CANCELLED = -32800  # LSP's RequestCancelled
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
SERVER_NOT_INITIALIZED = -32002  # LSP's own code
INVALID_PARAMS = -32602


class UnknownCommandError(InvalidArgumentsError):
    """`workspace/executeCommand` with a command name we do not provide."""


class InvalidParamsError(InvalidArgumentsError):
    """Params (or a response's result) that do not match the method's LSP type."""


class InvalidPositionError(InvalidArgumentsError):
    """A position that cannot be in the document (a line more than one past its last)."""


class DocumentNotOpenError(InvalidArgumentsError):
    """A `didChange` for a document the client never opened (or already closed)."""


class EditRejectedError(InvalidArgumentsError):
    """A `didChange` that cannot apply (a reversed or impossible range); nothing changed."""


class InvalidRequestError(CoreError):
    """A message that is JSON but not a JSON-RPC request, or a request after `shutdown`."""


class ParseError(CoreError):
    """A frame whose body is not JSON."""


class ServerNotInitializedError(CoreError):
    """A request before `initialize` (LSP's ServerNotInitialized)."""


_CODES = {
    Category.CANCELLED: REQUEST_CANCELLED,
    Category.MODEL_NOT_FOUND: MODEL_NOT_FOUND,
    Category.MODEL_LOAD_FAILED: MODEL_LOAD_FAILED,
    Category.ENGINE_CLOSED: ENGINE_CLOSED,
    Category.ENGINE_FAILED: MODEL_LOAD_FAILED,
    Category.CONTEXT_FAILED: CONTEXT_FAILED,
    Category.INVALID_ARGUMENTS: INVALID_PARAMS,
    Category.NOT_READY: NOT_READY,
}
_LSP_ONLY: list[tuple[type[BaseException], int, str]] = [
    (InvalidRequestError, INVALID_REQUEST, "Invalid request: {err}"),
    (ParseError, PARSE_ERROR, "Parse error: {err}"),
    (ServerNotInitializedError, SERVER_NOT_INITIALIZED, "Server not initialized: {err}"),
]


def to_rpc_error(err: BaseException) -> JsonRpcException:
    """The JSON-RPC error a client receives for `err`."""
    if isinstance(err, JsonRpcInternalError) and err.data:
        # pygls attaches the server's traceback; it goes to the log, not to the client.
        logger.error("internal error: %s %s", err.message, err.data)
        return JsonRpcInternalError(message=err.message)
    if isinstance(err, JsonRpcException):
        return err
    for kind, code, template in _LSP_ONLY:
        if isinstance(err, kind):
            return JsonRpcException(message=template.format(err=err), code=code)
    failure = classify(err)
    if failure.category is Category.INTERNAL:
        logger.error("unexpected error", exc_info=err)
        return JsonRpcInternalError(message=failure.message)
    return JsonRpcException(message=failure.message, code=_CODES[failure.category])


def user_message(err: BaseException) -> str:
    """The text shown in `window/showMessage` for an error outside a request."""
    return to_rpc_error(err).message
