"""Server errors, and the one place that maps every error to JSON-RPC.

Handlers raise or let through `EngineError`s, context errors and the
`ServerError`s below; `to_rpc_error` turns each into a JSON-RPC error with a
code and a message a user can act on.
"""
from __future__ import annotations

import logging

from pygls.exceptions import JsonRpcException, JsonRpcInternalError

from engine import errors as engine_errors

logger = logging.getLogger(__name__)

try:  # the context package may land after the server
    from context.errors import ContextError
except ImportError:  # pragma: no cover - depends on checkout state
    class ContextError(Exception):  # type: ignore[no-redef]
        """Stand-in until `context.errors` exists."""

# JSON-RPC reserves -32099..-32000 for implementation-defined server errors.
MODEL_NOT_FOUND = -32001
MODEL_LOAD_FAILED = -32002
NOT_READY = -32003
CONTEXT_FAILED = -32004
ENGINE_CLOSED = -32005
REQUEST_CANCELLED = -32800  # LSP's RequestCancelled
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602


class ServerError(Exception):
    """Base class of errors raised by the server itself."""


class InvalidArgumentsError(ServerError):
    """A command or request with arguments of the wrong shape."""


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


class InvalidRequestError(ServerError):
    """A message that is JSON but not a JSON-RPC request, or a request after `shutdown`."""


class ParseError(ServerError):
    """A frame whose body is not JSON."""


class NotReadyError(ServerError):
    """A request that needs the model or the workspace before they are loaded."""


_TABLE: list[tuple[type[BaseException], int, str]] = [
    (engine_errors.RequestCancelled, REQUEST_CANCELLED, "Request cancelled"),
    (engine_errors.ModelNotFoundError, MODEL_NOT_FOUND,
     "Model not found: {err}. Set `codectx.model.name` to a model directory, a .gguf file or a hub id"),
    (engine_errors.ModelLoadError, MODEL_LOAD_FAILED, "The model could not be loaded: {err}"),
    (engine_errors.EngineClosedError, ENGINE_CLOSED, "The engine is shut down"),
    (engine_errors.EngineError, MODEL_LOAD_FAILED, "Engine error: {err}"),
    (ContextError, CONTEXT_FAILED, "Could not build the repository context: {err}"),
    (InvalidArgumentsError, INVALID_PARAMS, "{err}"),
    (InvalidRequestError, INVALID_REQUEST, "Invalid request: {err}"),
    (ParseError, PARSE_ERROR, "Parse error: {err}"),
    (NotReadyError, NOT_READY, "{err}"),
]


def to_rpc_error(err: BaseException) -> JsonRpcException:
    """The JSON-RPC error a client receives for `err`."""
    if isinstance(err, JsonRpcInternalError) and err.data:
        # pygls attaches the server's traceback; it goes to the log, not to the client.
        logger.error("internal error: %s %s", err.message, err.data)
        return JsonRpcInternalError(message=err.message)
    if isinstance(err, JsonRpcException):
        return err
    for kind, code, template in _TABLE:
        if isinstance(err, kind):
            return JsonRpcException(message=template.format(err=err), code=code)
    logger.error("unexpected error", exc_info=err)
    return JsonRpcInternalError(message=f"Internal error: {type(err).__name__}: {err}")


def user_message(err: BaseException) -> str:
    """The text shown in `window/showMessage` for an error outside a request."""
    return to_rpc_error(err).message
