"""Read-only workspace tools the model may call during an ask.

The tool list is declared in the stable prefix (`TOOLS_PROMPT`). Calls follow
the Qwen/Hermes convention: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Every read goes through the workspace's access policy (`context.access`): tools
never leave the workspace, never follow a link out of it, never read `.git/`,
secrets or ignored files, and cap what they read and return.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from context.access import AccessPolicy, quoted_name
from context.errors import ContextError

MAX_RESULT_CHARS = 4000
MAX_ERROR_CHARS = 500
MAX_SEARCH_HITS = 20
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

TOOLS_PROMPT = f"""

You may call read-only tools. To call one, answer only with
{CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{CALL_CLOSE}
Tools:
- read_file {{"path": str, "start_line": int?, "end_line": int?}}: lines of a workspace file.
- find_definition {{"name": str}}: where a function or class is defined.
- search {{"text": str}}: lines containing the text.
"""


class ToolError(Exception):
    """A tool call that cannot be run (bad JSON, unknown tool, path outside the workspace).

    The message goes back to the model, so it is cut to `MAX_ERROR_CHARS` (a call may carry
    a megabyte-long name).
    """

    def __init__(self, message: str) -> None:
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS] + " [truncated]"
        super().__init__(message)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


def parse_tool_call(text: str) -> ToolCall | None:
    """The first complete tool call in model output, or None.

    Raises:
        ToolError: A call block whose body is not a JSON object with a name.
    """
    start = text.find(CALL_OPEN)
    if start < 0:
        return None
    end = text.find(CALL_CLOSE, start)
    body = text[start + len(CALL_OPEN): end if end >= 0 else len(text)].strip()
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as err:  # also an integer of 5,000 digits, arrays nested 100,000 deep
        raise ToolError(f"tool call is not JSON that codectx reads ({str(err)[:120]}): {body[:80]!r}") from err
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ToolError("tool call needs a string 'name'")
    arguments = data.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise ToolError("tool call 'arguments' must be an object")
    return ToolCall(data["name"], arguments)


class WorkspaceTools:
    """Runs tool calls inside a workspace, every read through its access policy.

    Args:
        access: The workspace's `context.access.AccessPolicy` (names, links, secrets,
            ignore rules, size cap).
        read_text: Returns a file's current text (open buffer or disk) through the same
            policy; raises `ContextError` for a file it refuses.
        files: Lists the workspace's files (the prefix's files, already admitted).
    """

    def __init__(self, access: AccessPolicy, read_text: Callable[[Path], str], files: Callable[[], list[Path]]) -> None:
        self.access = access
        self.root = access.given_root  # the editor's paths (open buffers are found by them)
        self.read_text = read_text
        self.files = files

    def run(self, call: ToolCall) -> str:
        """The tool's result text (truncated to MAX_RESULT_CHARS).

        Raises:
            ToolError: Unknown tool, invalid arguments or a file the policy refuses.
        """
        runners = {"read_file": self._read_file, "find_definition": self._find_definition, "search": self._search}
        if call.name not in runners:
            raise ToolError(f"unknown tool {call.name!r}; known: {sorted(runners)}")
        try:
            result = runners[call.name](**call.arguments)
        except TypeError as err:
            raise ToolError(f"bad arguments for {call.name}: {err}") from err
        return result if len(result) <= MAX_RESULT_CHARS else result[:MAX_RESULT_CHARS] + "\n[truncated]"

    def _read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        _require(path, str, "path")
        _require(start_line, int, "start_line")
        if end_line is not None:
            _require(end_line, int, "end_line")
        if start_line < 1 or (end_line is not None and end_line < start_line):
            raise ToolError(f"lines are numbered from 1 and end_line may not come before start_line "
                            f"(got start_line={start_line}, end_line={end_line})")
        try:
            text = self.read_text(self.root / self.access.relative(path))
        except ContextError as err:
            raise ToolError(
                f"{quoted_name(path)} is not a file inside the workspace that codectx may read ({err})") from err
        lines = text.splitlines()
        if start_line > max(len(lines), 1):
            raise ToolError(f"{quoted_name(path)} has {len(lines)} lines; start_line {start_line} is past its end")
        chosen = lines[start_line - 1: end_line]
        return "\n".join(f"{n}: {line}" for n, line in enumerate(chosen, start=start_line))

    def _find_definition(self, name: str) -> str:
        _require(name, str, "name")
        pattern = re.compile(rf"^\s*(?:async\s+)?(?:def|class|function|func|fn)\s+{re.escape(name)}\b")
        hits = self._grep(pattern.search)
        return "\n".join(hits) or f"no definition of {name!r} found"

    def _search(self, text: str) -> str:
        _require(text, str, "text")
        if not text:
            raise ToolError("search needs a non-empty 'text'")
        hits = self._grep(lambda line: text in line)
        return "\n".join(hits) or f"no line contains {text!r}"

    def _grep(self, matches: Callable[[str], object]) -> list[str]:
        hits = []
        for path in self.files():
            try:
                text = self.read_text(path)
            except ContextError:
                continue
            for number, line in enumerate(text.splitlines(), start=1):
                if matches(line):
                    hits.append(f"{self.access.relative(path)}:{number}: {line.strip()[:200]}")
                    if len(hits) >= MAX_SEARCH_HITS:
                        return hits
        return hits


def _require(value: object, kind: type, name: str) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ToolError(f"argument {name!r} must be {'a string' if kind is str else 'an integer'}, got {value!r}")
