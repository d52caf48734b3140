"""What a request names: the identifiers and paths in a question (input to `context.focus`)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

_PATH = re.compile(r"(?<![\w/])(?:\./)?((?:[\w.\-]+/)*[\w\-]+\.[A-Za-z0-9]+)(?![\w/])")
_WORD = re.compile(r"`([^`\n]+)`|([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\s*\()?")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_CAMEL = re.compile(r"[a-z0-9][A-Z]|^[A-Z][a-z0-9]+[A-Z]")
_COMMON = frozenset("""a an and are as at be by can code do does each file files for from function functions
get has have how i if in into is it its method methods module of on or repo repository return returns set
that the their then there this to use used uses value values what when where which who why with work works
class classes call calls called defined define definition type types
make makes made list lists show shows explain find all any some many most up out about only also
other these those them they python test tests module modules part parts main""".split())
"""Plain words a question uses without meaning a definition of that name ("Which files make up
the server?" names no `make`; "List the Python modules" no `modules`). Written as code they
still count: `make()`, `` `modules` ``."""


@dataclass(frozen=True)
class FocusQuery:
    """What one request is about.

    Attributes:
        question: The user's question (identifiers and paths named in it are focused).
        symbol: The identifier under the cursor, if any.
        path: The workspace-relative file of the cursor or the selection, if any.
        lines: The selection's first and last 1-based lines in `path`, if any.
    """

    question: str = ""
    symbol: str | None = None
    path: str | None = None
    lines: tuple[int, int] | None = None


@dataclass(frozen=True)
class NamedIdentifier:
    """An identifier as the question names it.

    Attributes:
        name: The identifier.
        shown: How the question wrote it (`preload()`, `Engine.submit`).
        strong: Written as code (called, in backticks, dotted, snake_case, CamelCase or
            CONSTANT_CASE); a plain lowercase word is weak and focused only when few files
            define it.
        qualifier: The name before it in a dotted name (`Engine` of `Engine.submit`), or "".
    """

    name: str
    shown: str
    strong: bool
    qualifier: str = ""


def named_paths(question: str, paths: Iterable[str]) -> list[tuple[str, str]]:
    """Workspace files the question names, as (path, how it was written), in question order.

    A name matches a path equal to it or ending in "/" + it (`blas.py` names `engine/blas.py`).
    """
    by_name: dict[str, list[str]] = {}
    for path in sorted(paths):
        by_name.setdefault(path.rpartition("/")[2], []).append(path)
    found: list[tuple[str, str]] = []
    for match in _PATH.finditer(question):
        written = match.group(1)
        for path in by_name.get(written.rpartition("/")[2], ()):
            if (path == written or path.endswith("/" + written)) and path not in (p for p, _ in found):
                found.append((path, written))
    return found


def named_identifiers(question: str, written_paths: Iterable[str] = ()) -> list[NamedIdentifier]:
    """Identifiers the question names, first occurrence first, leaving out the file names
    in `written_paths` (as `named_paths` found them: their parts are not identifiers)."""
    found: dict[str, NamedIdentifier] = {}
    for written in sorted(set(written_paths), key=len, reverse=True):
        question = question.replace(written, " " * len(written))

    def add(name: str, shown: str, strong: bool, qualifier: str = "") -> None:
        known = found.get(name)
        if known is None or (strong and not known.strong):
            found[name] = NamedIdentifier(name, shown, strong, qualifier)

    for match in _WORD.finditer(question):
        quoted, word, call = match.groups()
        if quoted is not None:
            names = _IDENT.findall(quoted)
            for i, name in enumerate(names):
                add(name, f"`{quoted.strip()}`", True, names[i - 1] if i and "." in quoted else "")
            continue
        parts = word.split(".")
        shown = word + ("()" if call else "")
        for i, name in enumerate(parts):
            strong = bool(call) or len(parts) > 1 or _looks_like_code(name)
            if strong or name.lower() not in _COMMON:
                add(name, shown, strong, parts[i - 1] if i else "")
    return list(found.values())


def _looks_like_code(name: str) -> bool:
    letters = name.strip("_")
    return ("_" in letters or bool(_CAMEL.search(name)) or (len(letters) >= 3 and letters.isupper())
            or name.startswith("_"))
