"""The hot tail: current copies of files edited since the last fold.

An edit must not move anything before it, or every checkpoint after the edited
file's place is lost. So the file's *built* text (from the last full build)
stays where it is, and its current text joins the tail of the prefix as a
"hot" segment whose header says it replaces the copy above. A fold (reindex,
or a tail that outgrows its share of the budget) puts current texts back in
their places and empties the tail.

`HotTail` remembers, in the order files became hot, the built text of each one
(None for a file that has no copy in place: new, map-only or over budget), and
keeps that small record on disk so a restarted server rebuilds the same layout.
"""
from __future__ import annotations

from pathlib import Path

from context import store

HOT_STATE_VERSION = 1


class HotTail:
    """Files in the hot tail, in the order they became hot, with their built texts.

    Args:
        path: Where the record is persisted (msgpack), or None to keep it in memory.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._built: dict[str, str | None] = {}

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

    def clear(self) -> None:
        self._built.clear()

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
