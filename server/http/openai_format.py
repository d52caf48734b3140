"""OpenAI wire shapes: completion objects, stream chunks, usage and server-sent events."""
from __future__ import annotations

import json
import time
from typing import Any

from engine.request import Metrics

# OpenAI's finish_reason has a closed set of values that typed clients check, so the engine's
# own reasons outside it are sent as "stop" and the engine's value goes in `codectx.finish_reason`.
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "stop", "error": "stop",
                  "repetition": "stop", "tool_calls": "tool_calls", None: None}


def usage(metrics: Metrics) -> dict[str, Any]:
    """`usage` with `prompt_tokens_details.cached_tokens` = tokens restored from checkpoints."""
    return {"prompt_tokens": metrics.prompt_tokens, "completion_tokens": metrics.decode_tokens,
            "total_tokens": metrics.prompt_tokens + metrics.decode_tokens,
            "prompt_tokens_details": {"cached_tokens": metrics.cached_tokens}}


def codectx_metrics(metrics: Metrics) -> dict[str, Any]:
    """The engine's own numbers (an extra `codectx` field; OpenAI clients ignore it)."""
    return metrics.as_dict()


def completion(request_id: str, model: str, text: str, finish_reason: str, metrics: Metrics,
               tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A non-streaming `chat.completion` object (with `tool_calls` when the model made some)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message = {"role": "assistant", "content": text or None,
                   "tool_calls": [{k: v for k, v in call.items() if k != "index"} for call in tool_calls]}
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if tool_calls else FINISH_REASONS[finish_reason]}],
            "usage": usage(metrics), "codectx": {**codectx_metrics(metrics), "finish_reason": finish_reason}}


def chunk(request_id: str, model: str, created: int, *, delta: dict[str, Any] | None = None,
          finish_reason: str | None = None, metrics: Metrics | None = None) -> dict[str, Any]:
    """One `chat.completion.chunk`; with `metrics` it is the usage chunk (no choices). The closing
    chunk (with `finish_reason`) carries the engine's own reason in `codectx.finish_reason`."""
    body: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                            "model": model}
    if metrics is not None:
        body.update(choices=[], usage=usage(metrics), codectx=codectx_metrics(metrics))
    else:
        body["choices"] = [{"index": 0, "delta": delta or {}, "logprobs": None,
                            "finish_reason": FINISH_REASONS.get(finish_reason, finish_reason)}]
        if finish_reason is not None:
            body["codectx"] = {"finish_reason": finish_reason}
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event carrying `data` (JSON unless it is already a string)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode("utf-8")


def model_list(ids: list[str], created: int) -> dict[str, Any]:
    """`/v1/models`."""
    return {"object": "list",
            "data": [{"id": i, "object": "model", "created": created, "owned_by": "codectx"} for i in ids]}
