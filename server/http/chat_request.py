"""An OpenAI chat-completions request body, validated into `ChatParams`.

Only what codectx can honour is accepted with meaning; unknown fields are
ignored, as OpenAI-compatible servers usually do. Fields of the wrong shape
raise `BadRequestError` naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.request import SamplingParams

from .errors import BadRequestError

ROLES = ("system", "developer", "user", "assistant", "tool")
# Template variables that would override what the server passes (or change what the
# tokenizer returns) are refused; everything else reaches the template as a variable.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "messages", "tools", "add_generation_prompt", "tokenize", "bos_token", "eos_token", "conversation",
    "documents", "chat_template", "continue_final_message", "sanitize_control_tokens", "padding",
    "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs"})
DEFAULT_MAX_TOKENS = 512
MAX_MODEL_NAME = 256
SEED_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class ChatParams:
    """What one chat completion asks for.

    Attributes:
        model: The requested model name.
        messages: Chat messages with string contents (text parts joined).
        max_tokens: Most tokens to generate.
        sampling: Temperature, top_p and seed.
        stop: Stop strings.
        stream: Answer as server-sent events.
        include_usage: Streaming only: end with a chunk carrying `usage`.
        tools: Tool schemas for the chat template (empty when tool_choice is "none").
        template_kwargs: Extra variables for the chat template (`chat_template_kwargs`).
    """

    model: str
    messages: tuple[dict[str, Any], ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    tools: tuple[dict[str, Any], ...] = ()
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequestError(f"'{name}' must be a number in [{low}, {high}]", param=name)
    return float(value)


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequestError("only text content parts are supported", param=f"messages[{index}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequestError("content must be a string or a list of text parts", param=f"messages[{index}].content")


def _messages(body: dict) -> tuple[dict[str, Any], ...]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequestError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequestError(f"each message needs a role, one of {', '.join(ROLES)}", param=f"messages[{i}]")
        out.append({**message, "content": _content(message, i)})
    return tuple(out)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise BadRequestError("'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    return tuple(stop)


def _max_tokens(body: dict) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadRequestError(f"'{name}' must be a positive integer", param=name)
            return value
    return DEFAULT_MAX_TOKENS


def _tools(body: dict) -> tuple[dict[str, Any], ...]:
    tools = body.get("tools")
    tools = [] if tools is None else tools
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise BadRequestError("'tools' must be a list of objects", param="tools")
    return () if body.get("tool_choice") == "none" else tuple(tools)


def _template_kwargs(body: dict) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise BadRequestError("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    if not all(key.isidentifier() for key in kwargs):
        raise BadRequestError("'chat_template_kwargs' keys must be identifiers", param="chat_template_kwargs")
    reserved = RESERVED_TEMPLATE_KWARGS & kwargs.keys()
    if reserved:
        raise BadRequestError(f"'chat_template_kwargs' may not set {', '.join(sorted(reserved))}",
                              param="chat_template_kwargs")
    return dict(kwargs)


def _flag(body: dict, name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequestError(f"'{name}' must be true or false", param=param or name)
    return value


def parse_chat_request(body: dict[str, Any]) -> ChatParams:
    """Validate a chat-completions body.

    Raises:
        BadRequestError: A field has the wrong type or value (the error names it).
    """
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL_NAME:
        raise BadRequestError(f"'model' must be a non-empty string of at most {MAX_MODEL_NAME} characters",
                              param="model")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise BadRequestError("only n=1 is supported", param="n")
    seed = body.get("seed")
    if seed is not None and (type(seed) is not int or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
        raise BadRequestError("'seed' must be a 64-bit integer", param="seed")
    stream_options = body.get("stream_options")
    stream_options = {} if stream_options is None else stream_options
    if not isinstance(stream_options, dict):
        raise BadRequestError("'stream_options' must be an object", param="stream_options")
    if body.get("top_p") == 0:
        raise BadRequestError("'top_p' must be in (0, 1]", param="top_p")
    sampling = SamplingParams(temperature=_number(body, "temperature", 0.0, 0.0, 2.0),
                              top_p=_number(body, "top_p", 1.0, 0.0, 1.0), seed=seed)
    return ChatParams(model=model, messages=_messages(body), max_tokens=_max_tokens(body), sampling=sampling,
                      stop=_stop(body), stream=_flag(body, "stream"),
                      include_usage=_flag(stream_options, "include_usage", "stream_options.include_usage"),
                      tools=_tools(body), template_kwargs=_template_kwargs(body))
