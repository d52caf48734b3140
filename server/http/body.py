"""Request bodies: declared as JSON, read under a size limit, parsed strictly.

Reading happens on the event loop (it only waits for bytes); parsing
(`parse_json_object`) is plain CPU work that the caller runs on a worker
thread. Every way a body can be malformed is a `BadRequestError` (400), so a
client never sees a 500 for its own input.
"""
from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request

from .errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

JSON_MEDIA_TYPE = "application/json"
MAX_DEPTH = 32
"""Deepest nesting of arrays and objects accepted (a chat request needs about 6)."""
MAX_INT_DIGITS = 20


def require_json_content_type(request: Request) -> None:
    """Raises:
        UnsupportedMediaTypeError: The body is not declared as ``application/json``.
    """
    declared = request.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != JSON_MEDIA_TYPE:
        shown = declared[:80] or "none"
        raise UnsupportedMediaTypeError(f"request bodies must be sent as Content-Type: {JSON_MEDIA_TYPE} "
                                        f"(got {shown})", code="unsupported_media_type")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused early when `Content-Length` or the bytes received exceed `limit`.

    Raises:
        PayloadTooLargeError: Over `limit`.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body of {declared} bytes is over the limit of {limit}",
                                   code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes",
                                       code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _invalid(message: str) -> BadRequestError:
    return BadRequestError(f"request body is not valid JSON: {message}", code="invalid_json")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on which duplicate wins; refusing them keeps one meaning.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _invalid(f"duplicate key {key[:40]!r}")
        obj[key] = value
    return obj


def _constant(name: str) -> Any:
    raise _invalid(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _invalid(f"number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _invalid(f"integer with {len(text)} digits is out of range")
    return int(text)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate from a \uD8xx escape
        raise _invalid(f"string holds an unpaired surrogate escape at character {err.start}") from err


def _check_tree(value: Any) -> None:
    """Depth and strings, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            for key in item:
                _check_text(key)
            children = item.values()
        else:
            children = item
        for child in children:
            if isinstance(child, str):
                _check_text(child)
            elif isinstance(child, dict | list):
                if depth + 1 > MAX_DEPTH:
                    raise _invalid(f"nested deeper than {MAX_DEPTH} levels")
                stack.append((child, depth + 1))


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """`raw` parsed as one JSON object: strict UTF-8 (no unpaired surrogate escapes either),
    finite numbers, integers of at most `MAX_INT_DIGITS` digits, no duplicate keys, at most
    `MAX_DEPTH` levels of nesting.

    Raises:
        BadRequestError: Anything else (code ``invalid_json``).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _invalid(f"not UTF-8 at byte {err.start}") from err
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float,
                           parse_int=_int)
    except BadRequestError:
        raise
    except RecursionError as err:  # the C scanner's own depth guard, far below our limit's cost
        raise _invalid(f"nested deeper than {MAX_DEPTH} levels") from err
    except ValueError as err:  # JSONDecodeError and int/float conversion errors
        raise _invalid(str(err)[:200]) from err
    if not isinstance(value, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    _check_tree(value)
    return value
