"""An editor buffer as a list of lines, so that an edit costs O(size of the edit).

A `didChange` touches one or two lines of a buffer that may hold megabytes. The
buffer keeps one string per line (with its terminator; the last line has none),
converts positions by looking only at the lines they name, and splices the new
lines in. The whole text is joined only when someone asks for it, then cached
until the next edit.

The text may be read from another thread (the prompt is built on a thread of its own):
`lock` is held while the text is joined and, by `Document.apply`, across a whole edit, so a
reader never sees half an edit nor caches a text older than the lines.

Invariant: `lines` is never empty, every line but the last ends with exactly one
terminator ("\\n", "\\r\\n" or "\\r"), and no line ending in a lone "\\r" is
followed by one starting with "\\n" (that pair is a single CRLF terminator).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from lsprotocol import types

from .convert import check_order, column_to_index, split_lines
from .errors import InvalidPositionError


@dataclass(frozen=True)
class Undo:
    """What one edit replaced: `lines[start:start + count]` were `removed` before it."""

    start: int
    removed: list[str]
    count: int


def _content(line: str) -> str:
    """A line without its terminator."""
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith(("\n", "\r")):
        return line[:-1]
    return line


class LineBuffer:
    """Text held as lines.

    Args:
        text: The initial text.
    """

    def __init__(self, text: str) -> None:
        self._lines = split_lines(text)
        self._text: str | None = text
        self.lock = threading.RLock()

    @property
    def text(self) -> str:
        """The whole text (joined on first use after an edit, then cached)."""
        with self.lock:
            if self._text is None:
                self._text = "".join(self._lines)
            return self._text

    @property
    def line_count(self) -> int:
        """Number of lines (a text ending with a terminator has an empty last line)."""
        return len(self._lines)

    def line(self, index: int) -> str:
        """Line `index` without its terminator."""
        return _content(self._lines[index])

    def locate(self, position: types.Position, encoding: types.PositionEncodingKind) -> tuple[int, int]:
        """(line index, code-point column) of an LSP position, clamped as LSP says.

        A character past the line's end is the line's end; the line just past the
        last one is the end of the document.

        Raises:
            InvalidPositionError: The line is more than one past the last line.
        """
        count = len(self._lines)
        if position.line < count:
            return position.line, column_to_index(self.line(position.line), position.character, encoding)
        if position.line == count:
            return count - 1, len(self._lines[-1])
        raise InvalidPositionError(
            f"line {position.line} is past the end of the document ({count} lines)")

    def replace(self, rng: types.Range, new_text: str, encoding: types.PositionEncodingKind) -> Undo:
        """Replaces `rng` with `new_text`; returns what `undo` needs to take it back.

        Raises:
            InvalidPositionError: The range ends before it starts, or a line more than
                one past the last.
        """
        check_order(rng)
        first, column = self.locate(rng.start, encoding)
        last, end_column = self.locate(rng.end, encoding)
        lines = self._lines
        region = lines[first][:column] + new_text + lines[last][end_column:]
        if first > 0 and region.startswith("\n") and lines[first - 1].endswith("\r"):
            first -= 1  # the "\r" ending the line before and this "\n" become one CRLF
            region = lines[first] + region
        new_lines = split_lines(region)
        if last < len(lines) - 1:
            new_lines.pop()  # the region ends with a terminator: the next line follows
        undo = Undo(first, lines[first:last + 1], len(new_lines))
        lines[first:last + 1] = new_lines
        self._text = None
        return undo

    def replace_all(self, text: str) -> Undo:
        """Replaces the whole text."""
        removed = self._lines
        self._lines = split_lines(text)
        self._text = text
        return Undo(0, removed, len(self._lines))

    def undo(self, steps: list[Undo], text: str | None) -> None:
        """Takes back `steps` (in the order they were made); `text` is the cached text
        from before the first of them (or None)."""
        for step in reversed(steps):
            self._lines[step.start:step.start + step.count] = step.removed
        self._text = text

    @property
    def cached_text(self) -> str | None:
        """The joined text if it is cached, else None (does not join)."""
        return self._text
