"""A built prefix: its segments, what was left out, and helpers to frame a question."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Mapping, Sequence

from context.languages import language_of
from context.scan import Skipped
from context.segments import Segment
from engine.request import SegmentKind

if TYPE_CHECKING:
    from context.graph import WorkspaceFile

_FILE_KINDS = (SegmentKind.FILE, SegmentKind.HOT)


@dataclass(frozen=True)
class FileRow:
    """One row of the explainable layout table (also for files only in the map)."""

    order: int | None
    path: str
    language: str
    tokens: int
    hash: str
    reason: str


def left_out_rows(files: Mapping[str, WorkspaceFile], mapped: Sequence[str],
                  omitted: Sequence[str]) -> tuple[FileRow, ...]:
    """Rows of kept files that are not whole: map-only, then omitted (over budget), each by path."""
    return tuple(FileRow(None, p, files[p].language, 0, files[p].content_hash[:8], reason)
                 for paths, reason in ((mapped, "map-only"), (omitted, "omitted (over budget)"))
                 for p in sorted(paths) if p in files)


@dataclass(frozen=True)
class Layout:
    """The stable prefix `[system][tools][map][files…][hot files]`.

    Attributes:
        segments: The prefix segments, in prompt order.
        left_out: Rows of kept files that are not whole (map-only, omitted).
        skipped: Files the scan left out, with reasons.
        budget: The token budget, or None for unlimited.
        system_piece: The template text before the system content (inside segments[0]).
    """

    segments: tuple[Segment, ...]
    left_out: tuple[FileRow, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    budget: int | None = None
    system_piece: str = ""
    notes: tuple[str, ...] = field(default=())

    @cached_property
    def rows(self) -> tuple[FileRow, ...]:
        """Every kept file with its place and reason: whole and hot files, then `left_out`."""
        whole = tuple(FileRow(i, s.key, language_of(s.key), len(s), s.hash[:8], s.reason)
                      for i, s in enumerate(self.segments) if s.kind in _FILE_KINDS)
        return whole + self.left_out

    @property
    def tokens(self) -> int:
        """Prefix length in tokens."""
        return sum(len(s.token_ids) for s in self.segments)

    def token_ids(self) -> list[int]:
        """The prefix's ids (concatenation of the segments' ids)."""
        return [t for s in self.segments for t in s.token_ids]

    def system_content(self) -> str:
        """The system message content the prefix stands for (without template text)."""
        return "".join(s.text for s in self.segments)[len(self.system_piece):]

    def index_of(self, kind: SegmentKind, key: str) -> int | None:
        """Position of a segment, or None."""
        for i, s in enumerate(self.segments):
            if s.kind == kind and s.key == key:
                return i
        return None

    def messages(self, question: str, turns: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
        """The chat messages this layout plus a question stand for (for rendering or a remote API)."""
        return [("system", self.system_content()), *turns, ("user", question)]
