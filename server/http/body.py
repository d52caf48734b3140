"""Reading a JSON request body under a size limit."""
from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from .errors import BadRequestError, PayloadTooLargeError


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    """The body parsed as a JSON object.

    Raises:
        PayloadTooLargeError: Content-Length or the bytes received exceed `limit`.
        BadRequestError: The body is not JSON, or not an object.
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
    try:
        value = json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequestError(f"request body is not valid JSON: {err}", code="invalid_json") from err
    if not isinstance(value, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    return value
