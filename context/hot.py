"""The hot tail: current copies of files edited since the last fold.

An edit must not move anything before it, or every checkpoint after the edited
file's place is lost. So the file's *built* text (from the last full build)
stays where it is, and its current text joins the tail of the prefix as a
"hot" segment whose header says it replaces the copy above, followed by a note
that the earlier copy is out of date and the changed lines as they read now
(`superseded_note`; docs/benchmarks.md "Answers after an edit"). A fold (reindex,
or a tail that outgrows its share of the budget) puts current texts back in
their places and empties the tail.

`HotTail` remembers, in the order files became hot, the built text of each one
(None for a file that has no copy in place: new, map-only or over budget), and
keeps that small record on disk so a restarted server rebuilds the same layout.
"""
from __future__ import annotations

from difflib import SequenceMatcher
from pathlib import Path
from typing import Callable

from context import store
from context.graph import WorkspaceFile
from context.languages import language_of
from context.segments import Segment, deleted_text, hot_file_text, neutralize, text_hash
from context.tags import TagCache
from engine.request import SegmentKind

HOT_STATE_VERSION = 1


CHANGED_LINES_SHOWN = 6
CHANGED_LINE_CHARS = 120


def superseded_note(rel: str, built: str, current: str) -> str:
    """The note after a hot copy whose stale copy stays in place: which copy is current, and the
    lines that differ from the stale copy as they read now (at most `CHANGED_LINES_SHOWN`).

    It follows the copy (the last words before the question) rather than preceding it, so the
    copy's own header stays the one every file segment has.
    """
    old, new = built.splitlines(), current.splitlines()
    steps = SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    changed = [line.strip() for tag, _i1, _i2, j1, j2 in steps if tag in ("replace", "insert")
               for line in new[j1:j2] if line.strip()]
    lines = [neutralize(line[:CHANGED_LINE_CHARS]) for line in changed[:CHANGED_LINES_SHOWN]]
    if len(changed) > CHANGED_LINES_SHOWN:
        lines.append(f"({len(changed) - CHANGED_LINES_SHOWN} more)")
    shown = "Changed lines, as they read now:\n" + "\n".join(lines) + "\n" if lines else "Lines were removed.\n"
    return (f'<note path="{rel}">The file above is the current {rel}; its copy earlier in this prompt is '
            f"out of date. {shown}</note>\n")


class HotTail:
    """Files in the hot tail, in the order they became hot, with their built texts.

    Args:
        share: Part of the budget the tail may use (of the stable prefix without a budget).
        path: Where the record is persisted (msgpack), or None to keep it in memory.
    """

    def __init__(self, share: float, path: Path | None = None) -> None:
        self.share = share
        self.path = path
        self._built: dict[str, str | None] = {}
        self._note_part: dict[str, float] = {}  # the share of a hot segment's text its note is

    def __contains__(self, rel: str) -> bool:
        return rel in self._built

    def __iter__(self):
        return iter(list(self._built))

    def __len__(self) -> int:
        return len(self._built)

    def built(self, rel: str) -> str | None:
        """The text of `rel`'s copy in place (None: it has none)."""
        return self._built.get(rel)

    def add(self, rel: str, built: str | None) -> None:
        """`rel` becomes hot (at the end of the tail) unless it already is."""
        self._built.setdefault(rel, built)

    def remove(self, rel: str) -> None:
        self._built.pop(rel, None)
        self._note_part.pop(rel, None)

    def clear(self) -> None:
        self._built.clear()
        self._note_part.clear()

    def load(self) -> None:
        """Replaces the record with the persisted one (empty when missing or unreadable)."""
        self._built = {}
        if self.path is None:
            return
        data = store.load(self.path)
        if data.get("version") != HOT_STATE_VERSION:
            return
        for row in data.get("hot") or ():
            if isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) \
                    and (row[1] is None or isinstance(row[1], str)):
                self._built[row[0]] = row[1]

    def save(self) -> None:
        """Persists the record (small: only the built texts of hot files)."""
        if self.path is not None:
            store.save(self.path, {"version": HOT_STATE_VERSION,
                                   "hot": [[rel, built] for rel, built in self._built.items()]})

    def swap_in_built(self, files: dict[str, WorkspaceFile], tags: TagCache) -> dict[str, WorkspaceFile | None]:
        """Puts each hot file's built text in `files` (so the build places it as before).

        Files whose current text equals their built text leave the tail; files without a
        copy in place leave `files`.

        Returns:
            path -> current entry (None: deleted) for the files still hot.
        """
        current: dict[str, WorkspaceFile | None] = {}
        for rel in self:
            now, built = files.pop(rel, None), self.built(rel)
            if built is not None and now is not None and now.text == built:
                self.remove(rel)  # back to the built text: nothing is hot
                files[rel] = now
                continue
            current[rel] = now
            if built is not None:
                files[rel] = WorkspaceFile(rel, language_of(rel), text_hash(built), built, False, tags)
        return current

    def room(self, budget: int | None) -> int:
        """Tokens of the budget kept free for the tail (0 without a budget)."""
        return int(budget * self.share) if budget is not None else 0

    def overflows(self, segments: list[Segment], budget: int | None) -> bool:
        """True when the tail outgrows its share (of the budget, else of the prefix) or the budget.

        The share bounds the current copies; their notes (`superseded_note`, a few lines each)
        count only toward the budget (a note's tokens taken as its part of the segment's characters:
        tokenizing it alone would cost an edit a second tokenization).
        """
        hot = sum(len(s) * (1 - self._note_part.get(s.key, 0.0)) for s in segments if s.kind == SegmentKind.HOT)
        total = sum(len(s) for s in segments)
        if budget is not None:
            return hot > self.room(budget) or total > budget
        return hot > self.share * (total - hot)

    def place(self, segments: list[Segment], rel: str, entry: WorkspaceFile | None,
              make: Callable[[str, str], Segment]) -> int:
        """Puts `rel`'s hot segment (or none) in the tail of `segments`; returns the index touched.

        Args:
            segments: The layout's segments, changed in place.
            rel: A path in the tail.
            entry: The file's current text, or None when it is deleted.
            make: Builds a hot segment from (text, reason).
        """
        built = self.built(rel)
        seg = None
        self._note_part.pop(rel, None)
        if entry is None:
            seg = None if built is None else make(deleted_text(rel), "hot (deleted)")
        elif built is None:
            seg = make(hot_file_text(rel, entry.language, entry.text, replaces=False), "hot (edited)")
        elif entry.text != built:
            text = hot_file_text(rel, entry.language, entry.text, replaces=True)
            note = superseded_note(rel, built, entry.text)
            seg = make(text + note, "hot (edited)")
            self._note_part[rel] = len(note) / len(text + note)
        at = next((i for i, s in enumerate(segments) if s.kind == SegmentKind.HOT and s.key == rel), None)
        if seg is None:
            self.remove(rel)
            if at is not None:
                segments.pop(at)
            return len(segments) if at is None else at
        if at is None:
            segments.append(seg)
            return len(segments) - 1
        segments[at] = seg
        return at
