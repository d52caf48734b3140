"""Focus: the definitions and files one request is about, as segments after the stable prefix.

The stable prefix holds what fits the budget; a question may be about code that did not
fit. `select_focus` picks, from every file the workspace keeps (whole, map-only or
omitted), what the request names: the definition under the cursor and what its text
uses, definitions in the selection, identifiers and file names in the question, the
selection's file. It reads the workspace's tree-sitter tags (`context.tags`, cached by
content), so nothing is parsed twice. Candidates are taken in relevance order:

1. the definition under the cursor, 2. definitions in the selection, 3. definitions of
identifiers the question writes as code (`preload()`, `Engine.submit`, snake_case,
CamelCase, CONSTANT_CASE), in question order, in the files the question names when it
names some, 4. plain words of the question that one or two files define, 5. what the
cursor's definition uses, 6. files the question names, 7. the selection's file.

Each is whole or left out (never cut): one that does not fit what is left of the budget
is skipped and reported. A candidate that contains ones already taken (a file holding a
focused definition) replaces them when the difference fits. Segments are
`SegmentKind.FOCUS`: not stable, so the prefix before them is byte-identical whatever
the question; each is `<file note="focus: …" path=… lines=…>` with its reason.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field, replace
from typing import Mapping

from context.focus_query import FocusQuery, named_identifiers, named_paths
from context.graph import WorkspaceFile
from context.segments import Segment, neutralize, text_hash
from context.tags import Definition, extract
from context.tokencache import TokenCache
from engine.request import SegmentKind

MAX_SITES = 3
"""Definitions taken per named identifier when no named file defines it (by path)."""
MAX_WEAK_DEFINERS = 2
"""A plain word is focused only when at most this many files define it."""
MAX_USES = 8
"""Definitions the cursor's definition uses that are taken (first use first)."""


@dataclass(frozen=True)
class FocusItem:
    """One focused piece: a definition (`name` set) or a whole file (`name` empty).

    Attributes:
        path: Workspace-relative path.
        name: The definition's name, or "" for a whole file.
        first: First line (1-based).
        last: Last line.
        reason: Why it was chosen.
        tokens: Its segment's tokens (0 until measured).
    """

    path: str
    name: str
    first: int
    last: int
    reason: str
    tokens: int = 0

    @property
    def kind(self) -> str:
        return "definition" if self.name else "file"

    def covers(self, other: FocusItem) -> bool:
        """`other` lies inside this item's lines of the same file."""
        return self.path == other.path and self.first <= other.first and other.last <= self.last

    def as_dict(self) -> dict:
        return {"kind": self.kind, "path": self.path, "name": self.name, "lines": [self.first, self.last],
                "tokens": self.tokens, "reason": self.reason}


@dataclass(frozen=True)
class Focus:
    """The focus of one request.

    Attributes:
        segments: `SegmentKind.FOCUS` segments, in prompt order (most relevant first).
        items: What they hold, in the same order.
        left_out: Candidates not taken, each with why (too large for what was left, ...).
        budget: The focus budget in tokens.
    """

    segments: tuple[Segment, ...] = ()
    items: tuple[FocusItem, ...] = ()
    left_out: tuple[tuple[FocusItem, str], ...] = field(default=())
    budget: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    def as_dict(self) -> dict:
        """For JSON (`codectx context --question`, `codectx.showContext`)."""
        return {"budget": self.budget, "tokens": self.tokens, "items": [i.as_dict() for i in self.items],
                "leftOut": [dict(i.as_dict(), why=why) for i, why in self.left_out]}

    def summary(self) -> str:
        """One line: what was focused (and its tokens), and how much was left out."""
        taken = ", ".join(f"{_where(i)} ({i.tokens} tok)" for i in self.items) or "nothing named"
        left = f"; {len(self.left_out)} left out" if self.left_out else ""
        return f"focus: {taken}; {self.tokens} of {self.budget} tokens{left}"

    def lines(self) -> list[str]:
        """A short human-readable account: what was focused and why, what was left out."""
        out = [f"focus: {len(self.items)} items, {self.tokens} tokens (budget {self.budget})"]
        out += [f"  {_where(i)}  {i.tokens} tok  {i.reason}" for i in self.items]
        out += [f"  left out {_where(i)}: {why}" for i, why in self.left_out]
        return out


def _where(item: FocusItem) -> str:
    return f"{item.path}:{item.first}-{item.last} {item.name}" if item.name else item.path


def select_focus(files: Mapping[str, WorkspaceFile], query: FocusQuery, tokens: TokenCache,
                 budget: int) -> Focus:
    """The focus of `query` over the workspace's `files`, within `budget` tokens.

    Args:
        files: Every file the workspace keeps, path -> file (current texts).
        query: What the request names.
        tokens: The workspace's token cache (the prompt's tokenizer).
        budget: Most tokens the focus segments may hold.
    """
    candidates, left_out = _Candidates(files, query).collect()
    chosen: list[FocusItem] = []
    texts: dict[tuple[str, int, int], str] = {}  # the segment text of each item, as measured
    for item in candidates:
        if any(c.covers(item) for c in chosen):
            continue
        text = _segment_text(files[item.path], item)
        item = replace(item, tokens=len(tokens.encode(text)))
        inside = [c for c in chosen if item.covers(c)]
        room = budget - sum(c.tokens for c in chosen) + sum(c.tokens for c in inside)
        if item.tokens > room:
            left_out.append((item, f"does not fit ({item.tokens} tokens, {room} left)"))
            continue
        texts[_span(item)] = text
        if inside:  # it replaces what it holds, in the place of the first of them
            at = chosen.index(inside[0])
            reason = "; ".join([item.reason] + [f"holds {c.name} ({c.reason})" for c in inside if c.name])
            chosen = [c for c in chosen if c not in inside]
            chosen.insert(at, replace(item, reason=reason))
        else:
            chosen.append(item)
    segments = tuple(Segment(SegmentKind.FOCUS, _key(item), texts[_span(item)], text_hash(texts[_span(item)]),
                             tokens.encode(texts[_span(item)]), item.reason) for item in chosen)
    return Focus(segments, tuple(chosen), tuple(left_out), budget)


def _span(item: FocusItem) -> tuple[str, int, int]:
    return item.path, item.first, item.last


def _key(item: FocusItem) -> str:
    return f"{item.path}:{item.first}-{item.last}" if item.name else item.path


def _segment_text(f: WorkspaceFile, item: FocusItem) -> str:
    """`<file note="focus: …" path=… language=… [lines=…]>` + the text + `</file>`. The note comes
    first: a hot or file segment of the same path at the same place shares no grid step with it,
    so what a focus left in the cache never passes for part of a later edit's copy."""
    lines = f.text.splitlines()
    body = neutralize("\n".join(lines[item.first - 1:item.last])).rstrip()
    span = f' lines="{item.first}-{item.last}"' if item.name else ""
    what = f"{item.name}, " if item.name else ""
    note = (what + item.reason).replace('"', "'")  # the reason quotes the question: keep it inert
    head = neutralize(f'<file note="focus: {note}" path="{item.path}" language="{f.language}"{span}>\n')
    return f"{head}{body}\n</file>\n" if body else f"{head}</file>\n"


class _Candidates:
    """Builds the candidates of one query in relevance order (see the module docstring)."""

    def __init__(self, files: Mapping[str, WorkspaceFile], query: FocusQuery) -> None:
        self.files = files
        self.query = query
        self.items: list[FocusItem] = []
        self.left_out: list[tuple[FocusItem, str]] = []
        self._definers: dict[str, list[tuple[str, Definition]]] | None = None
        self.paths = named_paths(query.question, files)
        self.names = named_identifiers(query.question, [w for _, w in self.paths])
        self.here = query.path if query.path in files else None

    def collect(self) -> tuple[list[FocusItem], list[tuple[FocusItem, str]]]:
        prefer = [p for p, _ in self.paths] + ([self.here] if self.here else [])
        cursor = self._resolve(self.query.symbol, prefer[-1:] + prefer, "under the cursor") \
            if self.query.symbol else []
        self._selection()
        for named in self.names:
            if named.strong:
                self._resolve(named.name, prefer, f"named in the question ({named.shown})", named.qualifier)
        for named in self.names:
            if not named.strong and 0 < len({p for p, _ in self._sites(named.name)}) <= MAX_WEAK_DEFINERS:
                self._resolve(named.name, prefer, f"named in the question ({named.shown})")
        for site in cursor[:1]:
            self._uses(site, prefer)
        for path, written in self.paths:
            self._add(FocusItem(path, "", 1, _line_count(self.files[path]), f"file named in the question ({written})"))
        if self.here:
            self._add(FocusItem(self.here, "", 1, _line_count(self.files[self.here]),
                                "the selection's file" if self.query.lines else "the cursor's file"))
        return self.items, self.left_out

    def _add(self, item: FocusItem) -> None:
        if not any((i.path, i.first, i.last) == (item.path, item.first, item.last) for i in self.items):
            self.items.append(item)

    def _index(self) -> dict[str, list[tuple[str, Definition]]]:
        """name -> (path, definition) over every file, by path then line (built once)."""
        if self._definers is None:
            self._definers = {}
            for path in sorted(self.files):
                for d in self.files[path].tags.definitions:
                    self._definers.setdefault(d.name, []).append((path, d))
        return self._definers

    def _sites(self, name: str) -> list[tuple[str, Definition]]:
        return self._index().get(name, [])

    def _resolve(self, name: str, prefer: list[str], reason: str, qualifier: str = "") -> list[FocusItem]:
        """Adds `name`'s definitions: those inside a definition of `qualifier` (`Engine.submit`),
        else those in `prefer`'s files, when there are any; else up to `MAX_SITES` by path."""
        sites = self._sites(name)
        owners = [(p, d) for p, d in self._sites(qualifier)] if qualifier else []
        preferred = [(p, d) for p, d in sites if any(p == q and o.line < d.line <= o.end_line for q, o in owners)]
        preferred = preferred or [s for p in prefer for s in sites if s[0] == p]
        chosen = preferred or sites[:MAX_SITES]
        items = [self._item(path, d, reason) for path, d in chosen]
        for item in items:
            self._add(item)
        if not preferred and len(sites) > MAX_SITES:
            for path, d in sites[MAX_SITES:]:
                self.left_out.append((self._item(path, d, reason), f"{name} is defined in {len(sites)} places; "
                                      f"the first {MAX_SITES} by path are taken"))
        return items

    def _item(self, path: str, d: Definition, reason: str) -> FocusItem:
        return FocusItem(path, d.name, d.line, max(d.line, d.end_line), reason)

    def _selection(self) -> None:
        """Definitions in the selection: the innermost one holding its first line, and those
        that start inside it."""
        if not (self.here and self.query.lines):
            return
        first, last = self.query.lines
        defs = self.files[self.here].tags.definitions
        holding = [d for d in defs if d.line <= first <= max(d.line, d.end_line)]
        inner = min(holding, key=lambda d: max(d.line, d.end_line) - d.line) if holding else None
        for d in ([inner] if inner else []) + [d for d in defs if first < d.line <= last]:
            self._add(self._item(self.here, d, "in the selection"))

    def _uses(self, site: FocusItem, prefer: list[str]) -> None:
        """Definitions that `site`'s text uses (its reference tags), first use first."""
        f = self.files[site.path]
        text = "\n".join(f.text.splitlines()[site.first - 1:site.last])
        names = [n for n in extract(f.language, textwrap.dedent(text)).references if n != site.name]
        names.sort(key=lambda n: (text.find(n), n))
        taken = 0
        for name in names:
            if taken == MAX_USES:
                break
            found = self._sites(name)
            if found and len({p for p, _ in found}) <= MAX_SITES:
                self._resolve(name, [site.path] + prefer, f"used by {site.name}")
                taken += 1


def _line_count(f: WorkspaceFile) -> int:
    return max(1, len(f.text.splitlines()))
