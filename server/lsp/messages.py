"""Decoded JSON to typed LSP messages, with errors that name the problem.

pygls structures a message inside `json.loads` and lets a failure escape its
read loop: the client never hears back. Here the envelope is checked first
(JSON-RPC 2.0: an object with `jsonrpc`, a string `method`, an integer or
string `id`), then the message is structured into its lsprotocol type; a
failure becomes an `InvalidRequestError` (-32600) or an `InvalidParamsError`
(-32602) whose message lists every bad field by its JSON path.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import attrs
import cattrs
from lsprotocol.types import ResponseErrorMessage
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage

from .errors import InvalidParamsError, InvalidRequestError

JSONRPC_VERSION = "2.0"
_MAX_PROBLEMS = 5  # a message lists at most this many bad fields


@dataclass(frozen=True)
class Envelope:
    """What a message is, read before its params are structured."""

    kind: str  # "request", "notification" or "response"
    method: str | None
    id: int | str | None


def message_id(data: Any) -> int | str | None:
    """The message's id if it is a valid one (for answering a message we reject)."""
    value = data.get("id") if isinstance(data, dict) else None
    return value if _valid_id(value) else None


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def envelope(data: Any) -> Envelope:
    """Checks the JSON-RPC envelope.

    Raises:
        InvalidRequestError: Not a JSON-RPC 2.0 message LSP allows.
    """
    if isinstance(data, list):
        raise InvalidRequestError("batches (JSON arrays) are not part of LSP")
    if not isinstance(data, dict):
        raise InvalidRequestError(f"a message must be a JSON object, got {type(data).__name__}")
    if data.get("jsonrpc") != JSONRPC_VERSION:
        raise InvalidRequestError(f'"jsonrpc" must be "2.0", got {data.get("jsonrpc")!r}')
    if "id" in data and not _valid_id(data["id"]):
        raise InvalidRequestError(f'"id" must be an integer or a string, got {data["id"]!r}')
    method = data.get("method")
    if "method" in data and not isinstance(method, str):
        raise InvalidRequestError(f'"method" must be a string, got {method!r}')
    if method is not None:
        return Envelope("request" if "id" in data else "notification", method, data.get("id"))
    if "id" in data and ("result" in data or "error" in data):
        return Envelope("response", None, data["id"])
    raise InvalidRequestError('neither a request ("method") nor a response ("result" or "error")')


def register_strict_primitives(converter: cattrs.Converter) -> None:
    """Makes `converter` reject wrong JSON types instead of coercing them
    (cattrs would turn "7" into 7, 7 into "7" and true into 1)."""
    def strict(kind: type, name: str):
        def structure(value: Any, _: type) -> Any:
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise _Expected(f"expected {name}, got {_json_repr(value)}")
            return value
        return structure

    converter.register_structure_hook(int, strict(int, "an integer"))
    converter.register_structure_hook(str, strict(str, "a string"))
    converter.register_structure_hook(bool, strict(bool, "true or false"))


def structure(converter: cattrs.Converter, data: dict, message_type: type, what: str) -> Any:
    """`data` as `message_type`.

    Raises:
        InvalidParamsError: A field is missing or of the wrong type or value; the
            message names `what` and each bad field.
    """
    try:
        return converter.structure(data, message_type)
    except Exception as err:  # noqa: BLE001 - any failure to structure is the sender's error
        raise InvalidParamsError(f"invalid {what}: {describe(err)}") from err


def message_type(protocol: Any, data: dict, kind: str) -> type:
    """The lsprotocol type to structure `data` into (pygls' own choice of type)."""
    if kind == "response":
        if "error" in data:
            return ResponseErrorMessage
        return protocol._result_types.pop(data["id"], None) or JsonRPCResponseMessage
    if kind == "request":
        return protocol.get_message_type(data["method"]) or JsonRPCRequestMessage
    return protocol.get_message_type(data["method"]) or JsonRPCNotification


def describe(err: BaseException) -> str:
    """The bad fields of a structuring error, by JSON path ("params.position.line: ...")."""
    if not isinstance(err, cattrs.BaseValidationError):
        return _format(err, None)
    problems = cattrs.transform_error(err, path="", format_exception=_format)
    lines = []
    for problem in problems:
        message, _, path = problem.rpartition(" @ ")
        lines.append(f"{_json_path(path)}: {message}" if path else message)
    extra = f" (and {len(lines) - _MAX_PROBLEMS} more)" if len(lines) > _MAX_PROBLEMS else ""
    return "; ".join(lines[:_MAX_PROBLEMS]) + extra


class _Expected(TypeError):
    """A JSON value of the wrong type (its message says which was expected)."""


def _format(err: BaseException, expected: Any) -> str:
    if isinstance(err, KeyError):
        return "required field missing"
    if isinstance(err, (_Expected, ValueError)):
        return str(err)
    if isinstance(err, TypeError) and expected is not None:
        return f"expected {_json_kind(expected)}"
    return f"{type(err).__name__}: {err}"


def _json_kind(expected: Any) -> str:
    origin = typing.get_origin(expected) or expected
    if isinstance(origin, type) and attrs.has(origin):
        return f"an object ({origin.__name__})"
    if origin in (list, tuple) or getattr(origin, "__name__", "") in ("Sequence", "List", "Tuple"):
        return "an array"
    return f"a value of type {getattr(expected, '__name__', expected)}"


def _json_path(path: str) -> str:
    """".params.text_document.uri" -> "params.textDocument.uri"."""
    parts = [part for part in path.split(".") if part]
    return ".".join(_camel(part) for part in parts)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _json_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
