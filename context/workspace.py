"""`Workspace`: scan, parse, order and tokenize a repository into a stable prefix, and keep it
current with O(changed file) updates."""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import xxhash

from context import budget as budgeting
from context import store
from context.chat import ChatTemplate
from context.errors import BudgetError, WorkspaceError
from context.home import codectx_home
from context.graph import RepoGraph, SegmentTexts, WorkspaceFile
from context.imports import ImportResolver
from context.languages import language_of
from context.layout import FileRow, Layout
from context.order import dependency_order, pinned
from context.scan import IgnoreRules, ScanRules, Skipped, SourceFile, keep_single, list_paths, scan
from context.segments import FILE_FORMAT, MAP_CLOSE, MAP_OPEN, Segment, block, map_entry, neutralize, text_hash
from context.tags import TagCache
from context.tokencache import TokenCache, text_key
from context.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

DEFAULT_SYSTEM = ("You are codectx, a coding assistant. The repository below is your context: "
                  "files appear whole inside <file> tags, and files that did not fit appear as "
                  "signatures in the <map>. Files edited most recently come last. "
                  "Answer questions about this code precisely and cite paths.")
DEFAULT_PINS = ("README*", "ARCHITECTURE*", "docs/architecture*", "DESIGN*")


class Workspace:
    """A repository as an ordered, hashed, tokenized prefix.

    Args:
        root: Workspace folder.
        tokenizer: Any `TextTokenizer` (fingerprint keys the token cache).
        budget: Token budget of the prefix, or None to include every file.
        pins: Globs of files always placed first (and ranked highest).
        include: Globs; when given, only matching files are considered.
        exclude: Globs of files to leave out.
        system: System instructions (the first segment).
        tools: Tool descriptions (second segment; empty for none).
        template: Chat template; default from `tokenizer.chat_template`.
        focus: Files open in the editor: rank is pulled toward them.
        max_file_bytes: Larger files are skipped.
        map_share: Part of the budget kept for the signature map when not all fits.
        hysteresis: Score bonus of files selected in the previous build.
        persist: Use the on-disk caches and state under $CODECTX_HOME.
        progress: Called as progress(done, total) while files are processed.

    Raises:
        WorkspaceError: `root` is not a folder.
    """

    def __init__(self, root: str | Path, tokenizer: TextTokenizer, budget: int | None = None,
                 pins: Sequence[str] = DEFAULT_PINS, include: Sequence[str] = (), exclude: Sequence[str] = (),
                 system: str = DEFAULT_SYSTEM, tools: str = "", template: ChatTemplate | None = None,
                 focus: Sequence[str] = (), max_file_bytes: int = 1 << 20, map_share: float = 0.1,
                 hysteresis: float = 0.5, persist: bool = True,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise WorkspaceError(f"workspace root is not a folder: {root}")
        self.tokenizer = tokenizer
        self.budget = budget
        self.pins = tuple(pins)
        self.rules = ScanRules(tuple(include), tuple(exclude), max_file_bytes)
        self.template = template or ChatTemplate(tokenizer.chat_template, getattr(tokenizer, "bos_token", ""),
                                                 getattr(tokenizer, "eos_token", ""))
        self.focus = tuple(focus)
        self.map_share = map_share
        self.hysteresis = hysteresis
        self.persist = persist
        self.progress = progress
        self.tokens = TokenCache(tokenizer, persist=persist)
        self.tags = TagCache(persist=persist)
        self._state_path = codectx_home() / "workspaces" / f"{xxhash.xxh3_64_hexdigest(str(self.root).encode())}.msgpack"
        self._system_piece = self.template.frame(("system", "user"))[0]
        self._system_text = block(neutralize(system))
        self._tools_text = block(neutralize(tools)) if tools.strip() else ""
        self._files: dict[str, WorkspaceFile] = {}
        self._hot: list[str] = []
        self._overlay: dict[str, str | None] = {}
        self._hot_reason: dict[str, str] = {}
        self._selected: frozenset[str] = frozenset()
        self._rank: dict[str, float] = {}
        self._ignore = IgnoreRules(self.root)
        self._resolver = ImportResolver(())
        self._side_rows: tuple = (None, ())
        self._replaced: set[str] = set()
        self._graph = RepoGraph({}, self._resolver, {})
        self._layout = Layout(())
        self._skipped: tuple[Skipped, ...] = ()
        self._mapped: list[str] = []
        self._omitted: list[str] = []

    @property
    def layout(self) -> Layout:
        """The current layout (after `build` or `update`)."""
        return self._layout

    # ----- cold build -------------------------------------------------------------------------

    def build(self) -> Layout:
        """Scans, parses, orders and tokenizes the whole workspace.

        Files changed on disk since the last build (per the persisted state) and files edited
        through `update` in this session are hot: they go to the tail.

        Raises:
            BudgetError: The budget cannot hold the system and tools segments.
        """
        paths, _ = list_paths(self.root)
        result = scan(self.root, self.rules, paths)
        self._files = {}
        self._replaced = set()
        files = {f.path: f for f in result.files}
        for rel, text in self._overlay.items():  # editor buffers win over the disk
            item = None if text is None else keep_single(self.root, rel, self.rules, self._ignore, text)
            files.pop(rel, None)
            if isinstance(item, SourceFile):
                files[rel] = item
        result.files = [files[p] for p in sorted(files)]
        total = len(result.files)
        for n, f in enumerate(result.files, 1):
            self._files[f.path] = self._entry(f)
            if self.progress and (n % 256 == 0 or n == total):
                self.progress(n, total)
        state = store.load(self._state_path) if self.persist else {}
        previous = state.get("hashes") or {}
        if previous:
            for path in sorted(self._files):
                if previous.get(path) != self._files[path].content_hash and path not in self._hot:
                    self._hot.append(path)
                    self._hot_reason[path] = "hot (changed on disk)"
        self._hot = [p for p in self._hot if p in self._files]
        if not self._selected:
            self._selected = frozenset(state.get("selected") or ())
        self._resolver = ImportResolver(self._files, self.root.name, self._read_go_mod())
        self._graph = RepoGraph(self._files, self._resolver, state)
        self._skipped = tuple(result.skipped)
        self._layout = self._assemble()
        self._save_state()
        return self._layout

    # ----- incremental update ------------------------------------------------------------------

    def update(self, path: str | Path, text: str | None) -> tuple[int, Layout]:
        """Applies one file's new text (edit or create) or its deletion (`text=None`).

        The file becomes hot: its segment leaves its place and joins the tail (a file that is
        already hot keeps its place in the tail). The map is not rebuilt (that would move every
        later segment); `build` refreshes it. Only the changed file is hashed and tokenized (chunks
        it did not touch hit the token cache); its tags are parsed at the next build.

        Args:
            path: Absolute, or relative to the root.
            text: The file's full new text, or None when it was deleted.

        Returns:
            (index of the first segment that changed, new layout); the index equals
            `len(layout.segments)` when nothing changed.
        """
        rel = self._relative(path)
        self._overlay[rel] = text
        segments = list(self._layout.segments)
        old = next((i for i, s in enumerate(segments) if s.key == rel and s.kind in ("file", "hot")), None)
        first = len(segments)
        if text is not None:
            item = keep_single(self.root, rel, self.rules, self._ignore, text)
            if isinstance(item, Skipped):
                self._skipped = tuple(s for s in self._skipped if s.path != rel) + (item,)
                text = None
        if text is None:
            if rel not in self._files:
                self._layout = replace(self._layout, skipped=self._skipped)
                return first, self._layout
            del self._files[rel]
            self._replaced.discard(rel)
            if rel in self._hot:
                self._hot.remove(rel)
            if old is not None:
                segments.pop(old)
                first = old
        else:
            entry = self._entry(item)
            current = self._files.get(rel)
            if current is not None and current.content_hash == entry.content_hash and old is not None:
                return first, self._layout
            if current is None:
                self._resolver.add(rel)
            self._files[rel] = entry
            self._hot_reason[rel] = "hot (edited)"
            seg = self._file_segment("hot", rel, "hot (edited)")
            if old is not None and segments[old].kind == "hot":
                segments[old] = seg
                first = old
            else:
                if old is not None:
                    segments.pop(old)
                    first = old
                if rel in self._hot:
                    self._hot.remove(rel)
                self._hot.append(rel)
                segments.append(seg)
                first = min(first, len(segments) - 1)
            for lst in (self._mapped, self._omitted):
                if rel in lst:
                    lst.remove(rel)
        first = min(first, self._fit(segments, first, rel))
        self._selected = frozenset(s.key for s in segments if s.kind in ("file", "hot"))
        self._layout = self._make_layout(segments, self._mapped, self._omitted)
        return first, self._layout

    def release(self, path: str | Path) -> None:
        """Forgets an editor buffer given to `update`: the next `build` reads the disk version."""
        self._overlay.pop(self._relative(path), None)

    def _fit(self, segments: list[Segment], first: int, edited: str) -> int:
        """Evicts whole files until the budget holds; returns the first index it touched.

        Files already after `first` go first (they are recomputed anyway), lowest score first;
        the edited file goes last.
        """
        if self.budget is None:
            return first
        total = sum(len(s) for s in segments)
        touched = len(segments)
        while total > self.budget:
            victims = [i for i, s in enumerate(segments) if s.kind in ("file", "hot") and s.key != edited]
            if not victims:
                victims = [i for i, s in enumerate(segments) if s.kind in ("file", "hot")]
            if not victims:
                raise BudgetError(f"budget {self.budget} cannot hold the fixed segments")
            if not self._rank:
                self._rank = RepoGraph(self._files, self._resolver, {}).rank(self._hot)
            pins = set(pinned([segments[i].key for i in victims], self.pins))
            i = min(victims, key=lambda i: (i < first, segments[i].kind == "hot", segments[i].key in pins,
                                            self._rank.get(segments[i].key, 0.0), segments[i].key))
            victim = segments.pop(i)
            total -= len(victim)
            touched = min(touched, i)
            self._omitted.append(victim.key)
            log.debug("evicted %s to fit budget %d", victim.key, self.budget)
        return touched

    def _relative(self, path: str | Path) -> str:
        p = Path(path)
        if p.is_absolute():
            try:
                p = Path(os.path.abspath(p)).relative_to(self.root)
            except ValueError as err:
                raise WorkspaceError(f"{path} is outside the workspace {self.root}") from err
        return p.as_posix()

    def _entry(self, f: SourceFile) -> WorkspaceFile:
        if f.replaced:
            self._replaced.add(f.path)
        else:
            self._replaced.discard(f.path)
        language = language_of(f.path)
        h = text_hash(f.text)
        return WorkspaceFile(f.path, language, h, f.text, f.replaced, self.tags)

    def _read_go_mod(self) -> str | None:
        try:
            return (self.root / "go.mod").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def _assemble(self) -> Layout:
        deps = self._graph.deps()
        pins = pinned(sorted(self._files), self.pins)
        stable = [p for p in pins if p not in self._hot]
        pinned_set = set(stable)
        rest = [p for p in self._files if p not in pinned_set and p not in self._hot]
        stable += dependency_order(sorted(rest), deps)
        head = [self._segment("system", "system", self._system_piece + self._system_text, "instructions")]
        if self._tools_text:
            head.append(self._segment("tools", "tools", self._tools_text, "tool descriptions"))
        fixed = sum(len(s) for s in head)
        if self.budget is not None and fixed > self.budget:
            raise BudgetError(f"budget {self.budget} is smaller than the system and tools segments ({fixed} tokens)")
        whole, mapped, omitted = self._select(stable, pins, fixed)
        segments = list(head)
        map_seg = self._map_segment(mapped)
        if map_seg is not None:
            segments.append(map_seg)
        reason = {p: "pinned" for p in pins}
        for p in stable:
            if p in whole:
                segments.append(self._file_segment("file", p, reason.get(p, self._order_reason(p))))
        for p in self._hot:
            if p in whole:
                segments.append(self._file_segment("hot", p, self._hot_reason.get(p, "hot")))
        self._selected = frozenset(whole)
        self._mapped, self._omitted = list(mapped), list(omitted)
        return self._make_layout(segments, mapped, omitted)

    def _order_reason(self, path: str) -> str:
        return f"rank {self._rank[path]:.4f}" if self.budget is not None and path in self._rank else "dependency order"

    def _select(self, stable: list[str], pins: list[str], fixed: int):
        everything = stable + self._hot
        if self.budget is None:
            return set(everything), [], []
        costs = self._file_costs(everything)
        avail = self.budget - fixed
        if sum(costs.values()) <= avail:
            return set(everything), [], []
        self._rank = self._graph.rank([*pins, *self._hot, *self.focus])
        score = budgeting.scores(self._rank, self._selected, self.hysteresis)
        for p in pins:
            score[p] = 1.0 + score[p]
        hot, _, used = budgeting.greedy(self._hot[::-1], lambda b: [costs[p] for p in b], avail)
        map_room = int(avail * self.map_share)
        candidates = [p for p in budgeting.by_score(score) if p not in self._hot]
        taken, left, used2 = budgeting.greedy(candidates, lambda b: [costs[p] for p in b], avail - used - map_room)
        left = [p for p in self._hot if p not in hot] + left
        room = avail - used - used2 - self._tokens_of(MAP_OPEN + MAP_CLOSE)
        mapped, omitted, _ = budgeting.greedy(
            left, lambda b: [len(t) for t in self.tokens.encode_many([self._map_text(p) for p in b])], room)
        whole = set(hot) | set(taken)
        while mapped and fixed + sum(costs[p] for p in whole) + len(self._map_segment(mapped)) > self.budget:
            omitted.insert(0, mapped.pop())  # tokenization of the joined map was not additive
        return whole, mapped, omitted

    def _file_costs(self, paths: list[str]) -> dict[str, int]:
        files = [self._files[p] for p in paths]
        keys = [text_key(f"{FILE_FORMAT}\0{f.path}\0{f.language}\0{f.content_hash}") for f in files]
        return dict(zip(paths, self.tokens.count_chunked(SegmentTexts(files), keys)))

    def _tokens_of(self, text: str) -> int:
        return len(self.tokens.encode(text))

    def _map_text(self, path: str) -> str:
        return map_entry(path, self._files[path].tags.definitions)

    def _map_segment(self, mapped: Sequence[str]) -> Segment | None:
        if not mapped:
            return None
        text = MAP_OPEN + "".join(self._map_text(p) for p in sorted(mapped)) + MAP_CLOSE
        return self._segment("map", "map", text, f"{len(mapped)} files as signatures")

    def _segment(self, kind: str, key: str, text: str, reason: str) -> Segment:
        return Segment(kind, key, text, text_hash(text), self.tokens.encode(text), reason)

    def _file_segment(self, kind: str, path: str, reason: str) -> Segment:
        text = self._files[path].segment_text
        return Segment(kind, path, text, text_hash(text), self.tokens.encode_chunked([text])[0], reason)

    def _make_layout(self, segments: list[Segment], mapped: Sequence[str], omitted: Sequence[str]) -> Layout:
        side = (tuple(mapped), tuple(omitted), len(self._files))
        if self._side_rows[0] != side:  # rebuilt only when the left-out files change
            self._side_rows = (side, tuple(self._left_out_rows(mapped, "map-only") +
                                           self._left_out_rows(omitted, "omitted (over budget)")))
        notes = tuple(f"{p}: invalid UTF-8 replaced" for p in sorted(self._replaced))
        layout = Layout(tuple(segments), self._side_rows[1], self._skipped, self.budget, self._system_piece, notes)
        if self.budget is not None and layout.tokens > self.budget:
            raise BudgetError(f"layout of {layout.tokens} tokens exceeds budget {self.budget}")
        return layout

    def _left_out_rows(self, paths: Sequence[str], reason: str) -> list[FileRow]:
        files = self._files
        return [FileRow(None, p, files[p].language, 0, files[p].content_hash[:8], reason)
                for p in sorted(paths) if p in files]

    def _save_state(self) -> None:
        if self.persist:
            store.save(self._state_path, {"hashes": {p: f.content_hash for p, f in self._files.items()},
                                          "selected": sorted(self._selected), **self._graph.to_state()})
            self.tokens.save()
            self.tags.save()

    def save(self) -> None:
        """Writes the token and tag caches (call when idle or on shutdown)."""
        if self.persist:
            self.tokens.save()
            self.tags.save()

    def prompt(self, question: str, turns: Sequence[tuple[str, str]] = ()) -> list[Segment]:
        """The current layout framed as a chat: see `context.prompt.prompt_segments`."""
        from context.prompt import prompt_segments

        return prompt_segments(self._layout, self.template, self.tokens, question, turns)
