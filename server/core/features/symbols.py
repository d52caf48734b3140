"""Identifiers under the cursor and where they are defined (tree-sitter tags from `context`)."""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import xxhash

from context.errors import ContextError
from context.languages import language_of
from context.tags import Definition, extract

from ..span import Span

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOCSTRING = re.compile(r'^\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', re.S)
MAX_SNIPPET_LINES = 40


@dataclass(frozen=True)
class DefinitionSite:
    """A definition with the text a model needs to explain it."""

    path: Path
    definition: Definition
    snippet: str

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
    return DefinitionSite(path, definition, snippet)


def references_in(site: DefinitionSite) -> tuple[str, ...]:
    """Names the definition's own text refers to (tree-sitter reference tags), sorted."""
    return extract(language_of(str(site.path)), textwrap.dedent(site.snippet)).references


class DefinitionIndex:
    """Definitions per file, re-parsed only when a file's text changes.

    Args:
        read_text: A file's current text (open buffer or disk).
    """

    def __init__(self, read_text: Callable[[Path], str]) -> None:
        self.read_text = read_text
        self._parsed: dict[Path, tuple[str, tuple[Definition, ...]]] = {}

    def definitions(self, path: Path) -> tuple[str, tuple[Definition, ...]] | None:
        """`path`'s current text and its definitions (None when it cannot be read)."""
        try:
            text = self.read_text(path)
        except (OSError, ContextError):  # gone, or refused by the access policy
            self._parsed.pop(path, None)
            return None
        cached = self._parsed.get(path)
        if cached is None or cached[0] != text:
            cached = (text, definitions_in(path, text))
            self._parsed[path] = cached
        return cached

    def find(self, name: str, current: Path, files: Iterable[Path]) -> DefinitionSite | None:
        """Where `name` is defined: the current file first, then `files` in order."""
        for path in [current] + [p for p in files if p != current]:
            found = self.definitions(path)
            if found is None:
                continue
            text, definitions = found
            for definition in definitions:
                if definition.name == name:
                    return site_of(path, text, definition, definitions)
        return None

    def dependencies_hash(self, site: DefinitionSite, files: Iterable[Path]) -> str:
        """xxh3 over the definitions `site` refers to (name and text of each, one level deep).

        An edit changes this hash only when it changes the text of something the
        symbol uses (or makes a used name resolve elsewhere).
        """
        files = list(files)
        digest = xxhash.xxh3_64()
        for name in references_in(site):
            if name == site.definition.name:
                continue
            used = self.find(name, site.path, files)
            if used is not None:
                digest.update(f"{name}\0{used.path}\0{used.key}\0".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()


def enclosing_definition(path: Path, text: str, line: int) -> DefinitionSite | None:
    """The last definition starting at or before 1-based `line`."""
    definitions = definitions_in(path, text)
    before = [d for d in definitions if d.line <= line and d.kind in ("function", "method", "class")]
    return site_of(path, text, before[-1], definitions) if before else None
