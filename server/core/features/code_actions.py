"""Code actions, listed instantly and filled in by `codeAction/resolve`.

Listing costs nothing: each action carries `data` naming what it does. Resolve
turns "explain", "ask" and "find bugs" into commands, and computes the
WorkspaceEdit of "add docstring" and "write tests" with the model.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

from context.errors import AccessDeniedError

from ..context_fit import answer_room, prompt_tokens
from ..prompt import Turn
from ..prompt_size import PromptTooLongError
from ..session import Session
from .symbols import DefinitionSite, enclosing_definition

ACTIONS = {
    "explain": "codectx: Explain selection",
    "docstring": "codectx: Add/update docstring",
    "findBugs": "codectx: Find bugs in selection",
    "tests": "codectx: Write tests for this function",
    "ask": "codectx: Ask about selection",
}
_UNSAFE = re.compile(r'"""|\'\'\'|\\|[^\S \n]|[\x00-\x1f\x7f]')
_BUG_LINE = re.compile(r"^\s*(?:line\s*)?(\d+)\s*[:.)-]\s*(.+)$", re.I)


@dataclass(frozen=True)
class Insertion:
    """Text to insert into `path` at 0-based (line, column); `create` when the file is new."""

    path: Path
    line: int
    column: int
    text: str
    create: bool = False


def clean_line(text: str, limit: int = 100) -> str:
    """One safe line of model text (no quotes that end a docstring, no control characters)."""
    flat = " ".join(_UNSAFE.sub(" ", text).split())
    return flat[:limit].strip() or "TODO: describe"


async def _complete(session: Session, question: str, max_tokens: int) -> str:
    """The model's answer to `question` after the repository prefix, within the model's context.

    Raises:
        PromptTooLongError: The code in `question` leaves the answer too little of the context.
    """
    segments = await session.prompt.call(session.prompt.segments, [Turn("user", question)])  # may fold: off the loop
    context_length = session.backend.context_length
    room = answer_room(segments, context_length, max_tokens)
    if not room:
        raise PromptTooLongError(f"the code with the repository prefix comes to {prompt_tokens(segments)} tokens, "
                                 f"which leave too little of the model's context of {context_length} for an answer: "
                                 f"select less")
    done = await session.generate(segments, max_tokens=room)
    return done.text


async def docstring_insertion(session: Session, path: Path, text: str, line: int) -> Insertion | None:
    """A docstring for the Python function or class around 1-based `line` (None if there is none)."""
    site = enclosing_definition(path, text, line)
    if site is None or path.suffix != ".py":
        return None
    answer = await _complete(session, f"Write a one-line docstring for:\n```\n{site.snippet}\n```",
                             session.settings.hover.max_tokens)
    lines = text.splitlines()
    header_end = _header_end(lines, site)
    body = lines[header_end + 1] if header_end + 1 < len(lines) else ""
    indent = body[: len(body) - len(body.lstrip())] or " " * 4
    return Insertion(path, header_end + 1, 0, f'{indent}"""{clean_line(answer)}"""\n')


def _header_end(lines: list[str], site: DefinitionSite) -> int:
    """0-based line where the definition's header (possibly multi-line) ends with ':'."""
    for index in range(site.definition.line - 1, len(lines)):
        if lines[index].rstrip().endswith(":"):
            return index
    return site.definition.line - 1


async def tests_insertion(session: Session, root: Path, path: Path, text: str, line: int) -> Insertion | None:
    """A test function for the Python function around `line`, in tests/test_<module>.py.

    The model's draft is used when it parses as Python; otherwise it is kept as
    comments under a failing placeholder, so the file always stays valid.

    Raises:
        AccessDeniedError: The access policy refuses the test file (`Session.edit_refusal`, or reading one
            that exists): the editor is offered no edit there.
    """
    site = enclosing_definition(path, text, line)
    target = root / "tests" / f"test_{path.stem}.py"
    if site is None or path.suffix != ".py":
        return None
    refusal = session.edit_refusal(target)
    if refusal is not None:  # e.g. a tests/ link that leads out of the workspace: no edit is offered there
        raise AccessDeniedError(f"{target.relative_to(root).as_posix()}: {refusal}")
    name = site.definition.name
    draft = await _complete(session, f"Write a pytest test function for:\n```\n{site.snippet}\n```",
                            session.settings.ask.max_tokens)
    module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
    existing = session.buffer_text(target)  # an open buffer's unsaved text wins
    if existing is None and os.path.lexists(target):
        existing = session.read_text(target)  # a test file codectx may not read is not one to append to
    taken = set(re.findall(r"^\s*(?:async\s+)?def\s+(\w+)", existing or "", re.M))
    block = _test_block(_free_name(f"test_{name}", taken), draft, taken)
    if existing is None:
        return Insertion(target, 0, 0, f"from {module} import {name}\n\n\n{block}", create=True)
    lines = existing.splitlines()
    separator = "\n\n" if existing.endswith("\n") else "\n\n\n"
    return Insertion(target, len(lines), 0, separator + block) if existing.endswith("\n") else \
        Insertion(target, len(lines) - 1, len(lines[-1]), separator + block)


def _free_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`... if the test file already defines it."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate


def _test_block(test_name: str, draft: str, taken: set[str]) -> str:
    """The model's draft if it is Python defining new test functions; else a placeholder named `test_name`."""
    code = draft.strip().strip("`")
    try:
        names = {node.name for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)}
        if any(name.startswith("test") for name in names) and not names & taken:
            return code.rstrip() + "\n"
    except (SyntaxError, ValueError):
        pass
    comments = "\n".join(f"    # {clean_line(line, 90)}" for line in draft.splitlines()[:8] if line.strip())
    return (f"def {test_name}():\n    # codectx draft (not valid Python, kept for reference):\n"
            f"{comments or '    # (empty)'}\n    raise NotImplementedError\n")


async def find_bugs(session: Session, selection: str, first_line: int) -> list[tuple[int, str]]:
    """(0-based line, message) pairs for suspected bugs in `selection` starting at `first_line`."""
    numbered = "\n".join(f"{i + 1}: {line}" for i, line in enumerate(selection.splitlines()))
    answer = await _complete(session, "List bugs in this code, one per line as `LINE: problem`; "
                             f"answer `none` if there are none.\n```\n{numbered}\n```",
                             session.settings.ask.max_tokens)
    count = max(1, len(selection.splitlines()))
    found = []
    for line in answer.splitlines():
        match = _BUG_LINE.match(line)
        if match and 1 <= int(match.group(1)) <= count:
            found.append((first_line + int(match.group(1)) - 1, clean_line(match.group(2), 200)))
    if not found and answer.strip() and answer.strip().lower().rstrip(".") != "none":
        found.append((first_line, clean_line(answer, 200)))
    return found
