"""The prompt from `context.Workspace`: ordered, hashed, token-cached segments, and the
conversation turns that follow the repository in it.

Open buffers feed `Workspace.update` lazily: an edit only marks its path dirty
and the next prompt (ask, hover, warm-up) flushes the dirty paths, so a burst
of keystrokes costs one update per file.

A flush can fold the hot tail into place and a rescan rebuilds the layout: seconds on a large
repository. The server therefore builds prompts on the builder's own thread (`WorkspacePrompt.call`),
never on its event loop, and the builder is thread-safe: one lock around everything that applies
changes or tokenizes, while `files`, `current_prefix`, `skipped` and `notes` read the current
layout, which is replaced whole and never changed in place.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from context.access import AccessPolicy
from context.errors import AccessDeniedError, WorkspaceError
from context.focus import Focus, select_focus
from context.focus_query import FocusQuery
from context.lru import LRUDict
from context.scan import ScanProgress, no_progress
from context.segments import Segment
from context.workspace import Workspace

from .settings import ContextSettings, FocusSettings

logger = logging.getLogger(__name__)
_conversation_ids = itertools.count(1)
T = TypeVar("T")


@dataclass(frozen=True)
class Turn:
    """One chat message after the repository (a question, answer or tool result)."""

    role: str
    content: str


def tokenizable(content: str) -> str:
    """`content` without lone surrogates (JSON can carry "\\ud800"; tokenizers refuse it)."""
    return content.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


MAX_CONVERSATIONS = 64


def _settled(method: Callable[..., T]) -> Callable[..., T]:
    """`WorkspacePrompt` methods that read the workspace: under its lock, after the marked changes are applied."""
    @functools.wraps(method)
    def settled(self: "WorkspacePrompt", *args, **kwargs) -> T:
        with self._lock:
            self._flush()
            return method(self, *args, **kwargs)
    return settled


class Conversations:
    """Turns of earlier asks, by conversation id."""

    def __init__(self, capacity: int = MAX_CONVERSATIONS) -> None:
        # Bounded: every ask without an id starts one, and a client may send any ids.
        self._turns: LRUDict[str, list[Turn]] = LRUDict(capacity)

    def get(self, conversation_id: str | None) -> tuple[str, list[Turn]]:
        if conversation_id is None or conversation_id not in self._turns:
            conversation_id = conversation_id or f"conv-{next(_conversation_ids)}"
            self._turns[conversation_id] = []
        return conversation_id, self._turns[conversation_id]

    def reset(self) -> None:
        self._turns.clear()


class WorkspacePrompt:
    """The server's prompt builder over `context.Workspace`.

    Args:
        root: The workspace folder.
        tokenizer: The model's tokenizer.
        buffer_text: An open buffer's text for a path, or None.
        tools: The tool list text (a prefix segment).
        settings: Budget, include/exclude globs and the extra deny patterns.
        progress: Told (stage, files done, files total) while the first scan runs; it may
            raise (`context.errors.ScanStopped`) to stop the scan.

    Raises:
        ContextError: The workspace cannot be scanned.
    """

    def __init__(self, root: Path, tokenizer, buffer_text: Callable[[Path], str | None], tools: str,
                 settings: ContextSettings, progress: ScanProgress | None = None) -> None:
        self.root = root
        self.buffer_text = buffer_text
        self.workspace = Workspace(root, tokenizer, budget=settings.budget_tokens, include=settings.include,
                                   exclude=settings.exclude, tools=tools, deny=settings.deny,
                                   progress=progress)
        self.workspace.build()
        self.workspace.progress = no_progress  # later builds (a reindex, a fold) are not the first scan
        self._dirty: set[Path] = set()
        self._marks = threading.Lock()  # `_dirty`: marked on the loop, taken on the builder's thread
        self._lock = threading.RLock()  # the workspace and its caches: one thread at a time
        # The server's builds, one after another on one thread: a build that waits for a fold holds no other
        # worker (a cancelled request's build still runs, and finds nothing left to apply).
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="codectx-prompt")

    async def call(self, fn: Callable[..., T], *args) -> T:
        """`fn(*args)` (a method of this builder, or a function that builds with it) on the builder's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, functools.partial(fn, *args))

    def close(self) -> None:
        """Lets the builder's thread end (a build under way finishes; queued ones are dropped)."""
        self._thread.shutdown(wait=False, cancel_futures=True)

    @property
    def files(self) -> list[Path]:
        """Files in the prefix (whole or as signatures), in prompt order."""
        rows = self.workspace.layout.rows
        return [self.root / row.path for row in rows]

    def current_prefix(self) -> list[Segment]:
        """The stable prefix as last built, without applying what changed since (no lock, no tokenizing:
        for the event loop, after a `prefix_segments` or `settle` on the builder's thread)."""
        return list(self.workspace.layout.segments)

    def mark_dirty(self, path: Path) -> None:
        """Notes that `path` changed (buffer edit or file event); applied on the next prompt."""
        with self._marks:
            self._dirty.add(path)

    @_settled
    def settle(self) -> None:
        """Applies every change marked so far (may fold the hot tail: call it off the event loop)."""

    def _flush(self) -> None:
        """Open buffers go in as the editor has them, other paths are read again from disk;
        both through the workspace's access policy. Every change is recorded before any is applied
        (`Workspace.update`'s `apply`): a fold on the way sees them all, and is the only one (a replace in
        300 open buffers of a budgeted workspace folded at each: 54-57 s in bench/context.py on this repository)."""
        with self._marks:
            dirty, self._dirty = self._dirty, set()  # a path marked meanwhile waits for the next flush
        try:
            changes = [(path, self.buffer_text(path)) for path in sorted(dirty)]
            for apply in (False, True):
                for path, text in changes:
                    try:
                        if text is not None:
                            self.workspace.update(path, text, apply=apply)
                        else:
                            self.workspace.reload(path, apply=apply)
                    except WorkspaceError as err:  # a path outside the workspace
                        if apply:
                            logger.debug("not in the workspace: %s (%s)", path, err)
        except BaseException:  # (a full disk, a budget): the next flush tries them again; applied ones are no-ops
            with self._marks:
                self._dirty |= dirty
            raise

    @property
    def access(self) -> AccessPolicy:
        """The workspace's access policy (every read of a workspace file goes through it)."""
        return self.workspace.access

    @_settled
    def rescan(self) -> None:
        """Rebuilds the layout from disk and buffers, edits folded into place (codectx.reindex)."""
        self.workspace.build(fold=True)

    @_settled
    def segments(self, turns: Sequence[Turn], focus: Sequence[Segment] = ()) -> list[Segment]:
        """The prompt for `turns`; the last turn is the question (engine segments as they are).
        `focus` (`focus(...).segments`) goes after the stable prefix, before the turns."""
        *earlier, question = turns
        return self.workspace.prompt(tokenizable(question.content), [(t.role, tokenizable(t.content)) for t in earlier],
                                     focus)

    @_settled
    def focus(self, query: FocusQuery, budget: int) -> Focus:
        """The focus of a request (`context.focus.select_focus`) over every file of the workspace,
        within `budget` tokens. `query.path` may be absolute; outside the workspace it is ignored."""
        if query.path is not None:
            try:
                query = replace(query, path=self.access.relative(query.path))
            except AccessDeniedError:
                query = replace(query, path=None, lines=None)
        return select_focus(self.workspace.files, query, self.workspace.tokens, budget)

    @_settled
    def fitted_focus(self, query: FocusQuery, turns: Sequence[Turn], settings: FocusSettings, context_length: int,
                     answer_tokens: int) -> Focus | None:
        """The focus of a request with `turns` under the `focus.*` settings (None when off), within
        what `context_length` leaves after the prompt without it and `answer_tokens`."""
        if not settings.enabled:
            return None
        room = context_length - sum(len(s.token_ids) for s in self.segments(turns)) - answer_tokens
        return self.focus(query, max(0, min(settings.budget_tokens, room)))

    @_settled
    def prefix_segments(self) -> list[Segment]:
        """The stable prefix alone: what warm-up prefills."""
        return list(self.workspace.layout.segments)

    @_settled
    def layout(self) -> list[dict]:
        """One row per prefix segment: kind, key, tokens, why it is there."""
        return segment_rows(self.workspace.layout.segments)

    def skipped(self) -> list[dict]:
        """Files and folders the access policy left out, with the reason (call after `layout`)."""
        return [{"path": s.path, "reason": s.reason} for s in self.workspace.layout.skipped]

    def notes(self) -> list[str]:
        """Notes on the prefix (a chat template framed as ChatML, invalid UTF-8 replaced)."""
        return list(self.workspace.layout.notes)


def segment_rows(segments: Sequence[Segment]) -> list[dict]:
    """One row per segment: kind, key, tokens, why it is there (`WorkspacePrompt.layout`)."""
    return [{"kind": s.kind, "key": s.key, "tokens": len(s.token_ids), "reason": s.reason} for s in segments]
