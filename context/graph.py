"""The workspace's files and the import/reference graph between them.

Import edges order files (dependencies first); import + reference edges rank them.
Edges and ranks are saved with the workspace state and reused for files whose
content and the set of paths did not change, so a warm build does not re-resolve.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import xxhash

from context.imports import ImportResolver
from context.rank import pagerank
from context.segments import file_text
from context.tags import FileTags, TagCache

_MAX_DEFINERS = 5
"""A name defined in more files than this is too common to link files by."""


@dataclass
class WorkspaceFile:
    """A kept file: its text, content hash and (lazily parsed) tags."""

    path: str
    language: str
    content_hash: str
    text: str
    replaced: bool
    tag_cache: TagCache
    _tags: FileTags | None = None

    @property
    def tags(self) -> FileTags:
        """Parsed on first use (an update does not need them until the next build)."""
        if self._tags is None:
            self._tags = self.tag_cache.get(self.language, self.content_hash, self.text)
        return self._tags

    @property
    def segment_text(self) -> str:
        return file_text(self.path, self.language, self.text)


class SegmentTexts(Sequence[str]):
    """Segment texts of files, built only for the items a cache asks for."""

    def __init__(self, files: list[WorkspaceFile]) -> None:
        self._files = files

    def __len__(self) -> int:
        return len(self._files)

    def __getitem__(self, i):
        return self._files[i].segment_text


def _hash(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))


def _strs(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _str_map(value: object, valid: Callable[[object], bool]) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and valid(v) for k, v in value.items())


STATE_ROWS: dict[str, Callable[[object], bool]] = {
    "hashes": lambda v: _str_map(v, lambda h: isinstance(h, str)),
    "selected": _strs,
    "paths_key": lambda v: isinstance(v, str),
    "deps": lambda v: _str_map(v, _strs),
    "rank": lambda v: v == {} or (isinstance(v, dict) and isinstance(v.get("key"), list) and len(v["key"]) == 2
                                  and isinstance(v["key"][0], str) and _strs(v["key"][1])
                                  and _str_map(v.get("values"), lambda x: type(x) is float)),
}
"""A workspace state file's rows and their shapes (`context.store.load`'s `row`): a row of another
shape is dropped, and the build recomputes what it held."""


def state_row(key: object, value: object) -> bool:
    check = STATE_ROWS.get(key) if isinstance(key, str) else None
    return check is not None and check(value)


class RepoGraph:
    """Import and reference edges between files, with saved-state reuse.

    Args:
        files: path -> file.
        resolver: Resolves import specs to paths.
        state: The state saved by the previous build (may be empty).
    """

    def __init__(self, files: Mapping[str, WorkspaceFile], resolver: ImportResolver, state: dict) -> None:
        self.files = files
        self.resolver = resolver
        self.state = state
        ordered = sorted(files)
        self.paths_key = _hash("\0".join(ordered))
        self.content_key = _hash("\0".join(f"{p}\0{files[p].content_hash}" for p in ordered))
        self._deps: dict[str, set[str]] | None = None
        self._rank: dict | None = None

    def deps(self) -> dict[str, set[str]]:
        """path -> paths it imports (resolved inside the workspace)."""
        if self._deps is None:
            same_paths = self.state.get("paths_key") == self.paths_key
            old_hashes, old_deps = self.state.get("hashes") or {}, self.state.get("deps") or {}
            deps: dict[str, set[str]] = {}
            for path, f in self.files.items():
                if same_paths and old_hashes.get(path) == f.content_hash and path in old_deps:
                    deps[path] = set(old_deps[path])
                    continue
                targets: set[str] = set()
                for spec in f.tags.imports:
                    targets.update(self.resolver.resolve(path, f.language, spec))
                targets.discard(path)
                deps[path] = targets
            self._deps = deps
        return self._deps

    def edges(self) -> dict[str, dict[str, float]]:
        """path -> {path it imports or references: weight}."""
        definers: dict[str, list[str]] = {}
        for path, f in self.files.items():
            for name in {d.name for d in f.tags.definitions}:
                if len(name) > 2 and not name.startswith("__"):
                    definers.setdefault(name, []).append(path)
        edges: dict[str, dict[str, float]] = {p: {q: 1.0 for q in ds} for p, ds in self.deps().items()}
        for path, f in self.files.items():
            out = edges[path]
            for name in f.tags.references:
                where = definers.get(name)
                if where and len(where) <= _MAX_DEFINERS:
                    for q in where:
                        if q != path:
                            out[q] = out.get(q, 0.0) + 1.0 / len(where)
        return edges

    def rank(self, focus: Sequence[str]) -> dict[str, float]:
        """Personalized PageRank toward `focus` (reused from the saved state when valid)."""
        key = [self.content_key, list(focus)]
        saved = self.state.get("rank") or {}
        if saved.get("key") == key:
            return saved["values"]
        values = pagerank(sorted(self.files), self.edges(), focus=focus)
        self._rank = {"key": key, "values": values}
        return values

    def to_state(self) -> dict:
        """What to save for the next build."""
        return {"paths_key": self.paths_key, "deps": {p: sorted(d) for p, d in self.deps().items()},
                "rank": self._rank or self.state.get("rank") or {}}
