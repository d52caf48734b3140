"""Core errors, and the one map from any error to a category and a user message.

Transports turn a `Failure`'s category into their own codes (JSON-RPC error codes in
`server.lsp.errors`, HTTP statuses in `server.http.errors`); the message is the same
wherever the error surfaces.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from context.errors import ContextError
from engine import errors as engine_errors


class CoreError(Exception):
    """Base class of errors raised by the server itself (core and transports)."""


class InvalidArgumentsError(CoreError):
    """A command or request with arguments of the wrong shape."""


class NotReadyError(CoreError):
    """A request that needs the model or the workspace before they are loaded."""


class Category(enum.Enum):
    """What kind of failure an error is, whatever transport reports it."""

    CANCELLED = "cancelled"
    MODEL_NOT_FOUND = "model_not_found"
    MODEL_LOAD_FAILED = "model_load_failed"
    ENGINE_CLOSED = "engine_closed"
    ENGINE_FAILED = "engine_failed"
    CONTEXT_FAILED = "context_failed"
    INVALID_ARGUMENTS = "invalid_arguments"
    NOT_READY = "not_ready"
    INTERNAL = "internal"


@dataclass(frozen=True)
class Failure:
    """An error as a transport reports it: its category and a message a user can act on."""

    category: Category
    message: str


_TABLE: list[tuple[type[BaseException], Category, str]] = [
    (engine_errors.RequestCancelled, Category.CANCELLED, "Request cancelled"),
    (engine_errors.ModelNotFoundError, Category.MODEL_NOT_FOUND,
     "Model not found: {err}. Set `codectx.model.name` to a model directory, a .gguf file or a hub id"),
    (engine_errors.ModelLoadError, Category.MODEL_LOAD_FAILED, "The model could not be loaded: {err}"),
    (engine_errors.EngineClosedError, Category.ENGINE_CLOSED, "The engine is shut down"),
    (engine_errors.ContextOverflowError, Category.INVALID_ARGUMENTS, "The request does not fit the model: {err}"),
    (engine_errors.EngineError, Category.ENGINE_FAILED, "Engine error: {err}"),
    (ContextError, Category.CONTEXT_FAILED, "Could not build the repository context: {err}"),
    (InvalidArgumentsError, Category.INVALID_ARGUMENTS, "{err}"),
    (NotReadyError, Category.NOT_READY, "{err}"),
]


def classify(err: BaseException) -> Failure:
    """The category and user message of `err` (INTERNAL for anything unexpected)."""
    for kind, category, template in _TABLE:
        if isinstance(err, kind):
            return Failure(category, template.format(err=err))
    return Failure(Category.INTERNAL, f"Internal error: {type(err).__name__}: {err}")
