"""Identifiers under the cursor and where they are defined (tree-sitter tags from `context`)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import xxhash

from context.languages import language_of
from context.tags import Definition, extract

from ..convert import Span

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOCSTRING = re.compile(r'^\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', re.S)
MAX_SNIPPET_LINES = 40


@dataclass(frozen=True)
class DefinitionSite:
    """A definition with the text a model needs to explain it."""

    path: Path
    definition: Definition
    snippet: str
    file_hash: str

    @property
    def key(self) -> str:
        """xxh3 of the definition's own text."""
        return xxhash.xxh3_64_hexdigest(self.snippet.encode("utf-8", "surrogatepass"))

    @property
    def docstring(self) -> str | None:
        body = self.snippet.split("\n", 1)[1] if "\n" in self.snippet else ""
        match = _DOCSTRING.match(body)
        return match.group(1).strip() if match else None


def identifier_at(text: str, offset: int) -> tuple[str, Span] | None:
    """The identifier touching `offset`, with its span."""
    for match in _IDENTIFIER.finditer(text, max(0, offset - 128), offset + 128):
        if match.start() <= offset <= match.end():
            return match.group(), Span(match.start(), match.end())
    return None


def definitions_in(path: Path, text: str) -> tuple[Definition, ...]:
    """The definitions tree-sitter finds in one file."""
    return extract(language_of(str(path)), text).definitions


def site_of(path: Path, text: str, definition: Definition, following: Iterable[Definition]) -> DefinitionSite:
    """Cuts the definition's text: from its line to the next top-level definition (capped)."""
    lines = text.splitlines()
    later = [d.line for d in following if d.line > definition.line]
    end = min(later + [definition.line + MAX_SNIPPET_LINES, len(lines) + 1])
    snippet = "\n".join(lines[definition.line - 1: end - 1]).rstrip()
    return DefinitionSite(path, definition, snippet, xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass")))


def find_definition(name: str, current: Path, files: Iterable[Path],
                    read_text: Callable[[Path], str]) -> DefinitionSite | None:
    """Where `name` is defined: the current file first, then the workspace in order."""
    for path in [current] + [p for p in files if p != current]:
        try:
            text = read_text(path)
        except OSError:
            continue
        definitions = definitions_in(path, text)
        for definition in definitions:
            if definition.name == name:
                return site_of(path, text, definition, definitions)
    return None


def enclosing_definition(path: Path, text: str, line: int) -> DefinitionSite | None:
    """The last definition starting at or before 1-based `line`."""
    definitions = definitions_in(path, text)
    before = [d for d in definitions if d.line <= line and d.kind in ("function", "method", "class")]
    return site_of(path, text, before[-1], definitions) if before else None
