"""Tool calls in model output, returned as OpenAI `tool_calls` when the request had tools.

Models trained on the Hermes/Qwen convention (and codectx's own tool prompt)
write ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. A block
whose body is not such a JSON object stays in the text. While streaming,
text that may begin a call is held back (`ToolCallStream`), so a client never
receives half a call as content.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|$)", re.S)


def _call(body: str, index: int) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    return {"index": index, "id": f"call_{index}", "type": "function",
            "function": {"name": data["name"],
                         "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}


def split_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(text outside valid call blocks, the calls in OpenAI's shape with `index`)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    cursor = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1).strip(), len(calls))
        if call is None:
            continue
        kept.append(text[cursor:match.start()])
        cursor = match.end()
        calls.append(call)
    kept.append(text[cursor:])
    return "".join(kept).strip() if calls else text, calls


@dataclass
class ToolCallStream:
    """Streams content while holding back anything from the first possible call opening."""

    _held: str = ""
    _calling: bool = False
    _text: list[str] = field(default_factory=list)

    def push(self, delta: str) -> str:
        """The part of `delta` that is plain content and safe to send now."""
        self._text.append(delta)
        if self._calling:
            return ""
        pending = self._held + delta
        start = pending.find(CALL_OPEN)
        if start >= 0:
            self._calling, self._held = True, ""
            return pending[:start]
        keep = next((n for n in range(min(len(CALL_OPEN) - 1, len(pending)), 0, -1)
                     if CALL_OPEN.startswith(pending[-n:])), 0)
        self._held = pending[len(pending) - keep:]
        return pending[:len(pending) - keep]

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content still to send, the calls) once generation has ended."""
        if not self._calling:
            return self._held, []
        text = "".join(self._text)
        rest, calls = split_tool_calls(text[text.find(CALL_OPEN):])
        return rest, calls
