"""Where names are defined, and the text of a definition: the one definition index.

Definitions come from the tree-sitter tags `context.tags` extracts (kind, name, first and
last line, signature), read through a `TagCache` keyed by content hash: given the
workspace's cache (`Workspace.tags`), a file the workspace parsed is not parsed again
here, and what the focus (`context.focus`), hover and code actions see are the same tags.
"""
from __future__ import annotations

import bisect
import re
import textwrap
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

import xxhash

from context.errors import ContextError
from context.languages import language_of
from context.segments import text_hash
from context.tags import Definition, FileTags, TagCache, extract

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOCSTRING = re.compile(r'^\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', re.S)
MAX_SNIPPET_LINES = 40
"""A definition's text is cut after this many lines (a hover explains, it does not quote)."""


@dataclass(frozen=True)
class ReferenceCount:
    """How many of the files searched refer to a name.

    Attributes:
        files: Files whose reference tags name it (tags hold distinct names per file, so
            this counts files, not occurrences).
        searched: Files searched (those that could be read).
    """

    files: int
    searched: int


@dataclass(frozen=True)
class DefinitionSite:
    """A definition with the text a model needs to explain it.

    Attributes:
        path: The file.
        definition: Its tag.
        snippet: Its text: from its first line to its last (at most `MAX_SNIPPET_LINES`).
        counter: Counts the references to its name over the files it was searched in (set
            by `DefinitionIndex.find`; counted only when asked, see `reference_count`).
    """

    path: Path
    definition: Definition
    snippet: str
    counter: Callable[[], ReferenceCount] | None = field(default=None, compare=False, repr=False)

    @property
    def reference_count(self) -> ReferenceCount | None:
        """References to its name in the files `DefinitionIndex.find` searched, or None for a
        site not found through the index."""
        return self.counter() if self.counter is not None else None

    @property
    def key(self) -> str:
        """xxh3 of the definition's own text."""
        return xxhash.xxh3_64_hexdigest(self.snippet.encode("utf-8", "surrogatepass"))

    @property
    def docstring(self) -> str | None:
        body = self.snippet.split("\n", 1)[1] if "\n" in self.snippet else ""
        match = _DOCSTRING.match(body)
        return match.group(1).strip() if match else None


def identifier_at(text: str, offset: int) -> tuple[str, tuple[int, int]] | None:
    """The identifier touching `offset`, with its (start, end) offsets."""
    for match in _IDENTIFIER.finditer(text, max(0, offset - 128), offset + 128):
        if match.start() <= offset <= match.end():
            return match.group(), (match.start(), match.end())
    return None


def tags_in(path: Path, text: str, tags: TagCache | None = None) -> FileTags:
    """The tree-sitter tags of one file: `tags`' when it parsed this text already (it keeps
    what it holds: editor versions do not pile up in it), else parsed now."""
    language = language_of(str(path))
    known = tags.lookup(language, text_hash(text)) if tags is not None else None
    return known or extract(language, text)


def definitions_in(path: Path, text: str, tags: TagCache | None = None) -> tuple[Definition, ...]:
    """The definitions tree-sitter finds in one file (see `tags_in`)."""
    return tags_in(path, text, tags).definitions


def site_of(path: Path, text: str, definition: Definition, following: Iterable[Definition]) -> DefinitionSite:
    """Cuts the definition's text: its own lines when the tag knows its end, else up to the next
    definition; at most `MAX_SNIPPET_LINES`."""
    lines = text.splitlines()
    if definition.end_line >= definition.line:
        end = definition.end_line + 1
    else:
        end = min([d.line for d in following if d.line > definition.line] + [len(lines) + 1])
    end = min(end, definition.line + MAX_SNIPPET_LINES, len(lines) + 1)
    snippet = "\n".join(lines[definition.line - 1: end - 1]).rstrip()
    return DefinitionSite(path, definition, snippet)


def references_in(site: DefinitionSite) -> tuple[str, ...]:
    """Names the definition's own text refers to (tree-sitter reference tags), sorted."""
    return extract(language_of(str(site.path)), textwrap.dedent(site.snippet)).references


class DefinitionIndex:
    """Definitions and referenced names per file, re-parsed only when a file's text changes.

    Args:
        read_text: A file's current text (open buffer or disk).
        tags: The workspace's tag cache (`Workspace.tags`): texts it parsed are not parsed
            again; None parses every new text here.
    """

    def __init__(self, read_text: Callable[[Path], str], tags: TagCache | None = None) -> None:
        self.read_text = read_text
        self.tags = tags
        self._parsed: dict[Path, tuple[str, FileTags]] = {}

    def definitions(self, path: Path) -> tuple[str, tuple[Definition, ...]] | None:
        """`path`'s current text and its definitions (None when it cannot be read)."""
        found = self._tags(path)
        return None if found is None else (found[0], found[1].definitions)

    def _tags(self, path: Path) -> tuple[str, FileTags] | None:
        """`path`'s current text and its tags, parsed once per text (None when it cannot be read)."""
        try:
            text = self.read_text(path)
        except (OSError, ContextError):  # gone, or refused by the access policy
            self._parsed.pop(path, None)
            return None
        cached = self._parsed.get(path)
        if cached is None or cached[0] != text:
            cached = (text, tags_in(path, text, self.tags))
            self._parsed[path] = cached
        return cached

    def references_count(self, name: str, files: Iterable[Path]) -> ReferenceCount:
        """How many of `files` (each once) refer to `name`: files whose tree-sitter reference
        tags (calls, arguments, types, ... as the language's query captures them) name it.
        Tags keep distinct names per file, so this counts files, not occurrences. Each file's
        tags are parsed once per text: a count costs a read and a lookup per file."""
        referring = searched = 0
        for path in dict.fromkeys(files):
            found = self._tags(path)
            if found is None:
                continue
            searched += 1
            names = found[1].references  # sorted
            at = bisect.bisect_left(names, name)
            if at < len(names) and names[at] == name:
                referring += 1
        return ReferenceCount(referring, searched)

    def find(self, name: str, current: Path, files: Iterable[Path], line: int | None = None
             ) -> DefinitionSite | None:
        """Where `name` is defined: the current file first, then `files` in order.

        With `line` (1-based, the cursor's in `current`), a file that defines `name` more than
        once (methods of several classes) answers with the one defined on that line, else
        the last one defined before it (the enclosing class's, for a call in a later method),
        else its first. The site counts references to `name` over `current` and `files`
        when asked (`DefinitionSite.reference_count`).
        """
        searched = [current] + [p for p in files if p != current]
        for path in searched:
            found = self.definitions(path)
            if found is None:
                continue
            text, definitions = found
            named = [d for d in definitions if d.name == name]
            if named:
                chosen = _nearest_above(named, line) if path == current and line is not None else named[0]
                return replace(site_of(path, text, chosen, definitions),
                               counter=partial(self.references_count, name, searched))
        return None

    def uses(self, site: DefinitionSite, files: Iterable[Path]) -> list[DefinitionSite]:
        """The definitions `site`'s text refers to, resolved like `dependencies_hash` (its file
        first, then `files`), in the order its text first names them; without `site` itself,
        what is defined inside its own text (already quoted with it) and names not found."""
        first_named = {name: _first_mention(site.snippet, name) for name in references_in(site)}
        definition = site.definition
        own = range(definition.line, max(definition.end_line, definition.line) + 1)
        resolve = self._resolver(site.path, files)
        used: list[DefinitionSite] = []
        for name in sorted(first_named, key=lambda n: (first_named[n], n)):
            if name == definition.name:
                continue
            found = resolve(name)
            if found is not None and not (found.path == site.path and found.definition.line in own):
                used.append(found)
        return used

    def dependencies_hash(self, site: DefinitionSite, files: Iterable[Path]) -> str:
        """xxh3 over the definitions `site` refers to (name and text of each, one level deep).

        An edit changes this hash only when it changes the text of something the
        symbol uses (or makes a used name resolve elsewhere).
        """
        resolve = self._resolver(site.path, files)
        digest = xxhash.xxh3_64()
        for name in references_in(site):
            if name == site.definition.name:
                continue
            used = resolve(name)
            if used is not None:
                digest.update(f"{name}\0{used.path}\0{used.key}\0".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def _resolver(self, current: Path, files: Iterable[Path]) -> Callable[[str], DefinitionSite | None]:
        """Resolves names as `find` without a line does, reading each file once: many names
        cost one pass over the files instead of one per name."""
        first: dict[str, tuple[Path, str, Definition, tuple[Definition, ...]]] = {}
        for path in dict.fromkeys([current, *files]):
            found = self.definitions(path)
            if found is not None:
                text, definitions = found
                for definition in definitions:
                    first.setdefault(definition.name, (path, text, definition, definitions))

        def resolve(name: str) -> DefinitionSite | None:
            hit = first.get(name)
            return None if hit is None else site_of(*hit)

        return resolve


def _first_mention(text: str, name: str) -> int:
    """Offset of `name`'s first whole-word occurrence in `text` (its length when absent)."""
    match = re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text)
    return match.start() if match else len(text)


def _nearest_above(named: list[Definition], line: int) -> Definition:
    """The definition on `line`, else the last before it, else the first (`named` in file order)."""
    above = [d for d in named if d.line <= line]
    return above[-1] if above else named[0]


def enclosing_definition(path: Path, text: str, line: int, tags: TagCache | None = None) -> DefinitionSite | None:
    """The last function, method or class starting at or before 1-based `line`."""
    definitions = definitions_in(path, text, tags)
    before = [d for d in definitions if d.line <= line and d.kind in ("function", "method", "class")]
    return site_of(path, text, before[-1], definitions) if before else None
