"""`Workspace`: scan, parse, order and tokenize a repository into a stable prefix, and keep it
current with O(changed file) updates."""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import xxhash

from context import budget as budgeting, store
from context.chat import ChatTemplate
from context.errors import AccessDeniedError, BudgetError, WorkspaceError
from context.home import codectx_home
from context.graph import RepoGraph, SegmentTexts, WorkspaceFile, state_row
from context.hot import HotTail
from context.imports import ImportResolver
from context.languages import language_of
from context.layout import Layout, left_out_rows
from context.order import dependency_order, pinned
from context.access import AccessPolicy
from context.prompt import DEFAULT_SYSTEM, prompt_segments
from context.scan import ScanProgress, ScanRules, Skipped, SourceFile, inside_skipped_folder, no_progress
from context.segments import FILE_FORMAT, MAP_CLOSE, MAP_OPEN, Segment, block, map_entry, neutralize, text_hash
from context.tags import TagCache
from context.tokencache import TokenCache, text_key
from context.tokenizer import TextTokenizer
from engine.request import SegmentKind

log = logging.getLogger(__name__)

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
        deny: Secret patterns (gitignore syntax) added to the access policy's deny list.
        map_share: Part of the budget kept for the signature map when not all fits.
        hysteresis: Score bonus of files selected in the previous build.
        hot_share: Part of the budget kept for the hot tail (current copies of edited files); without a budget, the
            share of the prefix the tail may grow to. A tail that outgrows it is folded into place (a full rebuild).
        persist: Use the on-disk caches and state under $CODECTX_HOME.
        progress: Called as progress(stage, done, total) while `build` parses files (stage "parsing") and tokenizes
            uncounted ones ("tokenizing", in batches). What it raises stops the build and propagates; no state is
            saved then. (The attribute of that name can be replaced between builds.)

    Raises:
        WorkspaceError: `root` is not a folder.
    """

    def __init__(self, root: str | Path, tokenizer: TextTokenizer, budget: int | None = None,
                 pins: Sequence[str] = DEFAULT_PINS, include: Sequence[str] = (), exclude: Sequence[str] = (),
                 system: str = DEFAULT_SYSTEM, tools: str = "", template: ChatTemplate | None = None,
                 focus: Sequence[str] = (), max_file_bytes: int = 1 << 20, map_share: float = 0.1,
                 hysteresis: float = 0.5, hot_share: float = 0.15, persist: bool = True,
                 progress: ScanProgress | None = None, deny: Sequence[str] = ()) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise WorkspaceError(f"workspace root is not a folder: {root}")
        self.tokenizer = tokenizer
        self.budget = budget
        self.pins = tuple(pins)
        self.rules = ScanRules(tuple(include), tuple(exclude), max_file_bytes)
        self.access = AccessPolicy(root, self.rules, deny)  # the root as given: editors send paths under it
        """The one gate for reading this workspace's files (also used by the server's features)."""
        self.template, template_note = (template, None) if template is not None else ChatTemplate.usable(
            tokenizer.chat_template, getattr(tokenizer, "bos_token", ""), getattr(tokenizer, "eos_token", ""))
        self._template_notes = (template_note,) if template_note else ()
        self.focus = tuple(focus)
        self.map_share = map_share
        self.hysteresis = hysteresis
        self.hot_share = hot_share
        self.persist = persist
        self.progress: ScanProgress = progress or no_progress
        self.tokens = TokenCache(tokenizer, persist=persist)
        self.tags = TagCache(persist=persist)
        state_name = xxhash.xxh3_64_hexdigest(os.fsencode(self.root))  # (a root not named in UTF-8 too)
        self._state_path = codectx_home() / "workspaces" / f"{state_name}.msgpack"
        self._tail = HotTail(hot_share, codectx_home() / "workspaces" / f"{state_name}.hot.msgpack"
                             if persist else None)
        self._system_piece = self.template.frame(("system", "user"))[0]
        self._system_text = block(neutralize(system))
        self._tools_text = block(neutralize(tools)) if tools.strip() else ""
        self._files: dict[str, WorkspaceFile] = {}
        self._recent: dict[str, str] = {}  # edited or changed on disk this session -> reason
        self._overlay: dict[str, str | None] = {}
        self._selected: frozenset[str] = frozenset()
        self._rank: dict[str, float] = {}
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

    def build(self, fold: bool = False) -> Layout:
        """Scans, parses, orders and tokenizes the whole workspace.

        Args:
            fold: Put edited files back in their places and empty the hot tail (reindex). Otherwise the hot tail
                recorded by earlier `update`s (also by an earlier process: it is persisted) is rebuilt as it was, so
                the prefix before it stays the same across restarts. Files changed on disk since the last build
                without such a record take their places (reason "changed on disk").

        Raises:
            BudgetError: The budget cannot hold the system and tools segments.
        """
        result = self.access.scan()
        self._files = {}
        self._replaced = set()
        files = {f.path: f for f in result.files}
        for rel, text in self._overlay.items():  # editor buffers win over the disk
            item = None if text is None else self.access.admit(rel, text)
            files.pop(rel, None)
            if isinstance(item, SourceFile):
                files[rel] = item
        result.files = [files[p] for p in sorted(files)]
        total = len(result.files)
        for n, f in enumerate(result.files, 1):
            self._files[f.path] = entry = self._entry(f)
            entry.tags  # parsed here (the order and map need them) so that progress counts the parsing
            self.progress("parsing", n, total)
        if fold:
            self._recent.update((p, "edited") for p in self._tail)
            self._tail.clear()
        elif not len(self._tail) and self.persist:
            self._tail.load()
        current = self._tail.swap_in_built(self._files, self.tags)
        state = store.load(self._state_path, state_row) if self.persist else {}
        previous = state.get("hashes") or {}
        for path in sorted(self._files):
            if previous and previous.get(path) != self._files[path].content_hash:
                self._recent.setdefault(path, "changed on disk")
        if not self._selected:
            self._selected = frozenset(state.get("selected") or ())
        self._resolver = ImportResolver(self._files, self.root.name, self._read_go_mod())
        self._graph = RepoGraph(self._files, self._resolver, state)
        self._skipped = tuple(result.skipped)
        segments = list(self._assemble().segments)  # (published once whole, below: read from other threads)
        self._save_state()
        for rel in self._tail:  # replay the hot tail over the built copies
            self._set_file(rel, current.get(rel))
            self._retail(segments, rel)
        self._tail.save()
        if len(self._tail) and self._tail.overflows(segments, self.budget) and not fold:
            return self.build(fold=True)
        self._layout = self._make_layout(segments, self._mapped, self._omitted)
        return self._layout

    # ----- incremental update ------------------------------------------------------------------

    def update(self, path: str | Path, text: str | None, apply: bool = True) -> tuple[int, Layout]:
        """Applies one file's new text (edit or create) or its deletion (`text=None`).

        Nothing before the hot tail moves: the file's built copy keeps its place and its current text goes to the
        tail as a "hot" segment that says it replaces the copy above (a deletion leaves a short note instead).
        Re-editing a hot file replaces its hot segment; editing it back to the built text removes it. When the tail
        outgrows `hot_share` (or the budget), the workspace is rebuilt with `build(fold=True)`. The map is not
        rebuilt (that would move every later segment). Only the changed file is hashed and tokenized; its tags are
        parsed at the next build.

        Args:
            path: Absolute, or relative to the root.
            text: The file's full new text, or None when it was deleted.
            apply: False records the text only, for a build or fold to read: many changes at once (a checkout, a
                replace in many buffers) are recorded first and then applied, so that one fold sees them all and
                the changes after it apply as no change (one change at a time could fold at each file).

        Returns:
            (index of the first segment that changed, new layout): `len(layout.segments)` when nothing did.
        """
        rel = self._relative(path)
        self._overlay[rel] = text
        if not apply:
            if getattr(self._files.get(rel), "text", None) != text:
                self._recent[rel] = "edited"  # the reason a fold that reads it gives
            return len(self._layout.segments), self._layout
        return self._apply(rel, None if text is None else self.access.admit(rel, text))

    def reload(self, path: str | Path, apply: bool = True) -> tuple[int, Layout]:
        """Reads one file again from disk through the access policy (a file event); `apply` as for `update`.

        A file that is gone is a deletion; one the policy refuses (a link out of the workspace, a secret, a FIFO)
        leaves the context with its reason reported. Returns as `update`.
        """
        rel = self._relative(path)
        self._overlay.pop(rel, None)
        self.access.changed(rel)
        if not apply:
            return len(self._layout.segments), self._layout
        item = self.access.read(rel)
        gone = isinstance(item, Skipped) and not os.path.lexists(self.root / rel)  # also a refused name
        # Editors report every write under .git/ (objects, index, logs): one row each would pile up.
        quiet = isinstance(item, Skipped) and inside_skipped_folder(rel, self._skipped)
        return self._apply(rel, None if gone else item, quiet)

    def _apply(self, rel: str, item: SourceFile | Skipped | None, quiet: bool = False) -> tuple[int, Layout]:
        """Puts one file's new state (kept, refused or deleted) into the layout; see `update`.
        `quiet`: a refusal is not listed (a folder above it is listed already)."""
        segments = list(self._layout.segments)
        self._skipped = tuple(s for s in self._skipped if s.path != rel)
        if isinstance(item, Skipped):
            if not quiet:
                self._skipped += (item,)
            item = None
        before = self._files.get(rel)
        if item is None and before is None:
            self._layout = replace(self._layout, skipped=self._skipped)
            return len(segments), self._layout
        entry = None if item is None else self._entry(item)
        if entry is not None and before is not None and before.content_hash == entry.content_hash:
            return len(segments), self._layout
        if rel not in self._tail:
            placed = self._layout.index_of(SegmentKind.FILE, rel) is not None
            self._tail.add(rel, before.text if placed and before is not None else None)
        if entry is not None and before is None:
            self._resolver.add(rel)
        self._set_file(rel, entry)
        self._recent[rel] = "edited"
        for lst in (self._mapped, self._omitted):
            if rel in lst:
                lst.remove(rel)
        first = self._retail(segments, rel)
        if self._tail.overflows(segments, self.budget):
            return self._fold()
        self._tail.save()
        self._selected = frozenset(s.key for s in segments if s.kind in (SegmentKind.FILE, SegmentKind.HOT))
        self._layout = self._make_layout(segments, self._mapped, self._omitted)
        return first, self._layout

    def release(self, path: str | Path) -> None:
        """Forgets an editor buffer given to `update`: the next `build` reads the disk version."""
        self._overlay.pop(self._relative(path), None)

    def _set_file(self, rel: str, entry: WorkspaceFile | None) -> None:
        if entry is not None:
            self._files[rel] = entry
        elif rel in self._files:
            del self._files[rel]
            self._replaced.discard(rel)

    def _retail(self, segments: list[Segment], rel: str) -> int:
        """Puts `rel`'s hot segment (or none) in the tail; returns the index it touched."""
        def make(text: str, reason: str) -> Segment:
            return self._segment(SegmentKind.HOT, rel, text, reason, chunked=True)

        return self._tail.place(segments, rel, self._files.get(rel), make)

    def _fold(self) -> tuple[int, Layout]:
        """A full rebuild with every edit in place; returns (first changed index, layout)."""
        old = self._layout.segments
        log.debug("hot tail over its share: folding %d file(s) into place", len(self._tail))
        new = self.build(fold=True).segments
        first = next((i for i, (a, b) in enumerate(zip(old, new)) if a.hash != b.hash), min(len(old), len(new)))
        return (len(new) if first == len(old) == len(new) else first), self._layout

    def _relative(self, path: str | Path) -> str:
        try:
            return self.access.relative(path)
        except AccessDeniedError as err:
            raise WorkspaceError(str(err)) from err

    def _entry(self, f: SourceFile) -> WorkspaceFile:
        (self._replaced.add if f.replaced else self._replaced.discard)(f.path)
        return WorkspaceFile(f.path, language_of(f.path), text_hash(f.text), f.text, f.replaced, self.tags)

    def _read_go_mod(self) -> str | None:
        item = self.access.read("go.mod")
        return item.text if isinstance(item, SourceFile) else None

    def _assemble(self) -> Layout:
        """Every file in its place (pins, then dependency order); the hot tail is added after."""
        deps = self._graph.deps()
        pins = pinned(sorted(self._files), self.pins)
        pinned_set = set(pins)
        stable = pins + dependency_order(sorted(p for p in self._files if p not in pinned_set), deps)
        head = [self._segment(SegmentKind.SYSTEM, "system", self._system_piece + self._system_text, "instructions")]
        if self._tools_text:
            head.append(self._segment(SegmentKind.TOOLS, "tools", self._tools_text, "tool descriptions"))
        fixed = sum(len(s) for s in head)
        if self.budget is not None and fixed > self.budget:
            raise BudgetError(f"budget {self.budget} is smaller than the system and tools segments ({fixed} tokens)")
        whole, mapped, omitted = self._select(stable, pins, fixed)
        segments = list(head)
        map_seg = self._map_segment(mapped)
        if map_seg is not None:
            segments.append(map_seg)
        for p in stable:
            if p in whole:
                reason = "pinned" if p in pinned_set else self._order_reason(p)
                if p in self._recent and p not in self._tail:
                    reason = f"{reason}; {self._recent[p]}"
                segments.append(self._segment(SegmentKind.FILE, p, self._files[p].segment_text, reason, chunked=True))
        self._selected = frozenset(whole)
        self._mapped, self._omitted = list(mapped), list(omitted)
        return self._make_layout(segments, mapped, omitted)

    def _order_reason(self, path: str) -> str:
        return f"rank {self._rank[path]:.4f}" if self.budget is not None and path in self._rank else "dependency order"

    def _select(self, stable: list[str], pins: list[str], fixed: int):
        """Whole, map-only and omitted files; `hot_share` of the budget stays free for edits."""
        if self.budget is None:
            return set(stable), [], []
        costs = self._file_costs(stable)
        limit = self.budget - self._tail.room(self.budget)
        avail = limit - fixed
        if sum(costs.values()) <= avail:
            return set(stable), [], []
        recent = [p for p in self._recent if p in costs]
        self._rank = self._graph.rank([*pins, *recent, *self.focus])
        score = budgeting.scores(self._rank, self._selected, self.hysteresis)
        for p in pins:
            score[p] = 1.0 + score[p]
        frame = len(self.tokens.encode(MAP_OPEN + MAP_CLOSE))
        map_room = int(avail * self.map_share) + frame  # the share is for entries, not the frame
        whole, mapped, omitted = budgeting.fit(
            costs, recent, budgeting.by_score(score), avail, map_room, frame,
            lambda b: [len(t) for t in self.tokens.encode_many([self._map_text(p) for p in b])])
        while mapped and fixed + sum(costs[p] for p in whole) + len(self._map_segment(mapped)) > limit:
            omitted.insert(0, mapped.pop())  # tokenization of the joined map was not additive
        return whole, mapped, omitted

    def _file_costs(self, paths: list[str]) -> dict[str, int]:
        files = [self._files[p] for p in paths]
        keys = [text_key(f"{FILE_FORMAT}\0{f.path}\0{f.language}\0{f.content_hash}") for f in files]
        counted = self.tokens.count_chunked(SegmentTexts(files), keys,
                                            lambda done, total: self.progress("tokenizing", done, total))
        return dict(zip(paths, counted))

    def _map_text(self, path: str) -> str:
        return map_entry(path, self._files[path].tags.definitions)

    def _map_segment(self, mapped: Sequence[str]) -> Segment | None:
        if not mapped:
            return None
        text = MAP_OPEN + "".join(self._map_text(p) for p in sorted(mapped)) + MAP_CLOSE
        return self._segment(SegmentKind.MAP, "map", text, f"{len(mapped)} files as signatures")

    def _segment(self, kind: SegmentKind, key: str, text: str, reason: str, chunked: bool = False) -> Segment:
        """`chunked`: tokenized in ~512-character chunks (files: an edit re-tokenizes only its chunks)."""
        ids = self.tokens.encode_chunked([text])[0] if chunked else self.tokens.encode(text)
        return Segment(kind, key, text, text_hash(text), ids, reason)

    def _make_layout(self, segments: list[Segment], mapped: Sequence[str], omitted: Sequence[str]) -> Layout:
        side = (tuple(mapped), tuple(omitted), len(self._files))
        if self._side_rows[0] != side:  # rebuilt only when the left-out files change
            self._side_rows = (side, left_out_rows(self._files, mapped, omitted))
        notes = self._template_notes + tuple(f"{p}: invalid UTF-8 replaced" for p in sorted(self._replaced))
        layout = Layout(tuple(segments), self._side_rows[1], self._skipped, self.budget, self._system_piece, notes)
        if self.budget is not None and layout.tokens > self.budget:
            raise BudgetError(f"layout of {layout.tokens} tokens exceeds budget {self.budget}")
        return layout

    def _save_state(self) -> None:
        if self.persist:
            store.save(self._state_path, {"hashes": {p: f.content_hash for p, f in self._files.items()},
                                          "selected": sorted(self._selected), **self._graph.to_state()})
        self.save()

    def save(self) -> None:
        """Writes the token and tag caches (call when idle or on shutdown)."""
        if self.persist:
            self.tokens.save()
            self.tags.save()

    @property
    def files(self) -> Mapping[str, WorkspaceFile]:
        """Every kept file (whole, map-only or omitted) by path, with its current text and tags."""
        return self._files

    def prompt(self, question: str, turns: Sequence[tuple[str, str]] = (), focus: Sequence[Segment] = ()):
        """The current layout framed as a chat (a list of segments): `context.prompt.prompt_segments`."""
        return prompt_segments(self._layout, self.template, self.tokens, question, turns, focus)

