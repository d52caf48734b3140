"""Checkpoints of model state at segment boundaries: lookup and the store.

Identity (where boundaries go and how they are keyed) is `engine.boundaries`;
a hit re-checks the tokens of every segment on the path, not only the hash.

The store keeps one **live cache** (the main line). Checkpoints on it are
offset marks: restoring one trims the attention KV (O(1)) and puts back the
recurrent snapshot taken at that boundary. When a request leaves the main
line (a different question, an edit), the checkpoints about to be overwritten
are *detached*: their tail of KV is copied out so that a later request can
branch back to them. Detached tails and recurrent snapshots are the bytes the
budget counts; eviction is LRU with protected checkpoints last. The archive's
copies are made the same way, late: when the engine is idle, or just before
the line leaves the rows they cover (`CheckpointStore.settle`).

The engine's worker thread is the only writer. Other threads may `plan` (what
`Engine.probe` does): the worker takes the store's lock only around its
changes to the index (never during MLX work or archive reads), and `plan`
holds it while it walks.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Sequence

from engine import state
from engine.boundaries import Boundary, boundaries
from engine.checkpoint_types import Checkpoint, Miss, Plan, common_prefix
from engine.request import SegmentLike

if TYPE_CHECKING:
    from engine.archive import CheckpointArchive
    from engine.archive_entry import ArchiveEntry

log = logging.getLogger(__name__)

_TOMBSTONES = 4096


class CheckpointStore:
    """Checkpoints for one policy over one live cache (changed on the engine's MLX thread only).

    Args:
        policy_fingerprint: `CachePolicy.fingerprint()` of the engine.
        budget_bytes: Bytes checkpoints may own (detached tails + snapshots).
        max_branch_tokens: A divergence detaches the old tail only when it is at
            most this long; a longer one (an edit early in the repo) is dropped.
        archive: Optional disk archive for restarts; written off the MLX thread.
        interval: Checkpoint grid inside the stable prefix (see `cut_points`).
    """

    def __init__(self, policy_fingerprint: str, budget_bytes: int,
                 max_branch_tokens: int = 8192, archive: CheckpointArchive | None = None,
                 interval: int | None = None):
        self.policy_fingerprint = policy_fingerprint
        self.budget_bytes = budget_bytes
        self.max_branch_tokens = max_branch_tokens
        self.archive = archive
        self.interval = interval
        self._by_key: dict[str, Checkpoint] = {}
        self._line: list[Checkpoint] = []
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._tick = 0
        self._lock = threading.RLock()  # the index (_by_key, _line, _evicted) against `plan` elsewhere
        self._owed: list[Checkpoint] = []  # recorded for the archive, its copy not yet made (`settle`)

    # -- lookup -------------------------------------------------------------

    def boundaries(self, segments: Sequence[SegmentLike],
                   layout_key: Callable[[int], int] | None = None) -> list[Boundary]:
        """`boundaries` under this store's policy and grid."""
        return boundaries(self.policy_fingerprint, segments, self.interval, layout_key)

    def plan(self, bounds: Sequence[Boundary], limit: int) -> Plan:
        """The longest valid checkpoint path ending before token `limit`.

        `limit` is the prompt length: the stretch after the last boundary before it
        is always recomputed, so the request has its last logits and cold and warm
        runs end with the same forward call. Safe from any thread.
        """
        path: list[Checkpoint] = []
        archived: list[Any] = []
        first_miss: Boundary | None = None
        with self._lock:
            for b in bounds:
                cp = self._by_key.get(b.key)
                in_memory = cp is not None and cp.matches(b)
                if b.end >= limit:  # never restored, but a new question is still named as the miss
                    first_miss = None if in_memory or self._archive_entry(b) is not None else b
                    break
                if not archived and in_memory:
                    path.append(cp)
                    continue
                entry = self._archive_entry(b)
                if entry is not None:
                    archived.append(entry)
                    continue
                first_miss = b
                break
        return Plan(path, archived, self._miss(first_miss) if first_miss else None)

    def _archive_entry(self, b: Boundary) -> ArchiveEntry | None:
        """The archive's entry for `b` when it holds one that matches, else None."""
        entry = self.archive.get(b.key) if self.archive else None
        return entry if entry is not None and entry.matches(b) else None

    def _miss(self, b: Boundary) -> Miss:
        with self._lock:
            evicted = b.key in self._evicted
            siblings = [c.boundary for c in self._by_key.values() if c.boundary.parent == b.parent]
        if evicted:
            return Miss("evicted")
        if self.archive is not None and self.archive.was_corrupt(b.key):
            return Miss("corrupt archive entry")
        best = None
        if self.archive is not None:
            siblings += self.archive.children(b.parent)
        for s in siblings:
            if s.start == b.start:
                n = common_prefix(s.tokens, b.tokens)
                best = n if best is None else max(best, n)
        if best is not None:
            return Miss("diverged", b.start + best)
        if self.archive is not None and self.archive.other_policy_has(b.token_key):
            return Miss("policy mismatch")
        return Miss("new prefix")

    # -- restore / record / rollback -----------------------------------------

    def restore(self, cache: Sequence[Any], plan: Plan, room_until: int = 0) -> tuple[int, Miss | None]:
        """Make the live cache hold exactly the state at the end of `plan`; rows appended to window caches come
        with room in their buffers up to position `room_until` (`engine.state.append_kv_spans`).

        Returns:
            (tokens restored, miss reason); an archive entry failing its
            checksum ends the restore early with "corrupt archive entry".
        """
        self._tick += 1
        common = 0
        while (common < len(plan.path) and common < len(self._line)
               and plan.path[common] is self._line[common]):
            common += 1
        if any(cp.kv is None for cp in plan.path[common:]):
            raise state.StateError("a main-line checkpoint is not on the live line")
        base = self._line[common - 1].boundary.end if common else 0
        self.settle(cache, above=base)  # the archive's copies of rows about to be overwritten
        self._leave_line(cache, common, base)
        state.trim_to(cache, base)
        spans = [(cp.kv, cp.boundary.end - cp.boundary.start) for cp in plan.path[common:]]
        with self._lock:
            for cp in plan.path[common:]:
                cp.kv = None
                self._line.append(cp)
        miss = plan.miss
        for entry, data in (self.archive.read_ahead(plan.archived) if plan.archived else ()):
            try:
                kv, rec = self.archive.load(entry, data)
            except Exception as err:  # noqa: BLE001 - any unreadable entry is a miss
                log.warning("archive entry %s unusable: %s", entry.key, err)
                miss = Miss("corrupt archive entry")
                break
            spans.append((kv, entry.end - entry.start))
            cp = Checkpoint(entry.boundary(), rec)
            with self._lock:
                self._by_key[cp.key] = cp
                self._line.append(cp)
        state.append_kv_spans(cache, spans, room_until)  # one copy per layer, however many spans
        for cp in self._line:
            cp.last_used = self._tick
        self._set_recurrent(cache)
        self._enforce_budget()
        return self.line_offset, miss

    def record(self, cache: Sequence[Any], b: Boundary) -> Checkpoint | None:
        """Register the live state after fully prefilling boundary `b`'s segment.

        Returns:
            The checkpoint, or None when the line below `b` was evicted meanwhile
            (a budget smaller than the line's own snapshots): nothing to chain to.

        Raises:
            StateError: If the live cache does not end exactly at `b`.
        """
        if state.attention_offset(cache) != b.end:
            raise state.StateError(f"cannot record boundary [{b.start}, {b.end}) with the "
                                   f"cache at {state.attention_offset(cache)}")
        if self.line_offset != b.start:
            log.debug("line ends at %d, not recording [%d, %d)", self.line_offset, b.start, b.end)
            return None
        self._tick += 1
        cp = Checkpoint(b, state.snapshot_recurrent(cache), None, self._tick)
        with self._lock:
            old = self._by_key.pop(b.key, None)
            if old is not None:
                self._forget(old)
            self._by_key[b.key] = cp
            self._line.append(cp)
        for c in self._line:
            c.last_used = self._tick
        if self.archive is not None and b.kind.archived and self.archive.get(b.key) is None:
            self._owed.append(cp)  # copied for the archive by `settle`, off the request's path
        self._enforce_budget()
        return cp

    def settle(self, cache: Sequence[Any], above: int = -1, stop: Callable[[], bool] | None = None) -> int:
        """Hand the archive its copies of the checkpoints recorded since, those whose spans end after `above` (all
        by default), newest first, until `stop()` says to stop; return how many are still owed.

        `record` leaves the copy for later: a checkpoint's rows stay in the live cache until the line leaves them,
        and `restore` and `rollback` settle what they are about to overwrite before they do, so the copies are made
        where nothing waits on them (the engine's worker settles between requests, `engine.engine`). On the H200 a
        record with its copy took 5-22 ms (median 13) for a 2,048-row checkpoint of an 8-bit cache, 0.82 s of a
        131k-token cold ask (run q's `records`, docs/benchmarks.md, seventeenth session). Newest first: the hot tail
        an edit overwrites next goes first, so a short pause before the edit's ask spares it the copies; a child may
        then reach the archive before its parent, which a restart can use only once the parent follows (the worker
        settles all before it exits). A copy that fails is logged and skipped: the archive is an optimization, and
        rollback must go on.
        """
        owed = [cp for cp in self._owed if cp.boundary.end > above]
        began, done = time.perf_counter(), 0
        for cp in reversed(owed):
            if stop is not None and stop():
                break
            self._owed.remove(cp)
            b = cp.boundary
            if self.archive is None or self.archive.get(b.key) is not None:
                continue
            try:
                self.archive.submit(b, state.copy_kv_span(cache, b.start, b.end), cp.recurrent)
            except Exception as err:  # noqa: BLE001 - e.g. out of memory: the archive does without this one
                log.warning("not archiving the checkpoint at %d: %s", b.end, err)
                continue
            done += 1
        if done and log.isEnabledFor(logging.DEBUG):
            seconds = time.perf_counter() - began
            log.debug("copied %d checkpoint(s) for the archive: %.4f s", done, seconds,
                      extra={"archive_copy": (done, seconds)})
        return len(self._owed)

    def copy_ahead(self, cache: Sequence[Any], stop: Callable[[], bool] | None = None) -> int:
        """Copy the line's one-off tail (its checkpoints after the last of an archived kind: a question, its header,
        an answer) out of the live cache between requests, newest first until `stop()`; return how many are left.

        The next request leaves that tail (a new question or an edit does), and `_leave_line` would copy it then,
        on the request's path: 7-11 ms for a 45-row question over a 131k-token 8-bit cache on the H200 (the
        `detach` of runs u and w, docs/benchmarks.md). A copy made ahead never evicts anything: one that would pass
        the budget is not kept, and the budget releases these copies before any checkpoint (`_enforce_budget`). A
        tail longer than `max_branch_tokens` is not copied (the line drops it when it leaves), and copies further
        down the line (a tail the conversation went on from) are released. A copy stays valid while its checkpoint
        is on the line: the line's rows under a checkpoint never change.
        """
        tail: list[Checkpoint] = []
        for cp in reversed(self._line):
            if cp.boundary.kind.archived:
                break
            tail.append(cp)
        too_long = not tail or tail[0].boundary.end - tail[-1].boundary.start > self.max_branch_tokens
        for cp in self._line:
            if cp.kv is not None and (too_long or cp not in tail):
                cp.kv = None
        left = [] if too_long else [cp for cp in tail if cp.kv is None]
        done = 0
        for cp in left:
            if stop is not None and stop():
                break
            try:
                cp.kv = state.copy_kv_span(cache, cp.boundary.start, cp.boundary.end)
            except Exception as err:  # noqa: BLE001 - e.g. out of memory: the next request copies what it leaves
                log.warning("not copying the line's tail ahead: %s", err)
                return 0
            if self.nbytes > self.budget_bytes:  # not at the cost of a checkpoint: the request will copy it
                cp.kv = None
                return 0
            done += 1
        return len(left) - done

    def forget_owed(self) -> None:
        """Owe the archive nothing (a live cache no longer known to hold its checkpoints' rows)."""
        self._owed.clear()

    def rollback(self, cache: Sequence[Any]) -> int:
        """Drop unconfirmed state (a cancelled prefill or decode); return the offset kept."""
        self.settle(cache, above=self.line_offset)
        state.trim_to(cache, self.line_offset)
        self._set_recurrent(cache)
        return self.line_offset

    def on_line(self, cp: Checkpoint) -> bool:
        """Whether `cp` is on the live line (a mark into the live cache, whatever copy `copy_ahead` gave it)."""
        return cp in self._line

    @property
    def line_offset(self) -> int:
        """Tokens of confirmed state on the live line."""
        return self._line[-1].boundary.end if self._line else 0

    def _set_recurrent(self, cache: Sequence[Any]) -> None:
        if state.has_recurrent(cache):
            state.restore_recurrent(cache, self._line[-1].recurrent if self._line else {})

    def _leave_line(self, cache: Sequence[Any], keep: int, base: int) -> None:
        """Detach (or drop) the line's checkpoints after position `keep`."""
        leaving = self._line[keep:]
        with self._lock:
            del self._line[keep:]
        if not leaving:
            return
        detach = leaving[-1].boundary.end - base <= self.max_branch_tokens
        began, copied = time.perf_counter(), []
        for cp in leaving:
            if not detach:
                self._drop(cp)
            elif cp.kv is None:  # else `copy_ahead` copied it between requests
                cp.kv = state.copy_kv_span(cache, cp.boundary.start, cp.boundary.end)
                copied.append(cp.boundary.end - cp.boundary.start)
        if copied and log.isEnabledFor(logging.DEBUG):  # benchmarks read `detach` (bench/request_profile.ForwardLog)
            seconds = time.perf_counter() - began
            log.debug("detached %d checkpoint(s) after %d, %d copied here: %.4f s", len(leaving), base, len(copied),
                      seconds, extra={"detach": (sum(copied), seconds)})

    # -- memory ------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes owned by all checkpoints (the live cache is not counted)."""
        return sum(cp.nbytes for cp in self._by_key.values())

    def checkpoints(self) -> list[Checkpoint]:
        """All checkpoints, in token order."""
        return sorted(self._by_key.values(), key=lambda c: (c.boundary.end, c.key))

    def set_budget(self, budget_bytes: int) -> None:
        """Change the byte budget, evicting at once if it is now exceeded."""
        self.budget_bytes = budget_bytes
        self._enforce_budget()

    def _enforce_budget(self) -> None:
        total = self.nbytes
        for cp in self._line:  # copies made ahead (`copy_ahead`) go first: nothing needs them yet
            if total > self.budget_bytes and cp.kv is not None:
                total -= state.nbytes(cp.kv)
                cp.kv = None
        while total > self.budget_bytes and self._by_key:
            victim = min(self._by_key.values(),
                         key=lambda c: (c.boundary.protected, c.last_used, -c.boundary.end))
            total -= self._drop(victim)

    def _drop(self, cp: Checkpoint) -> int:
        """Evict `cp` and every checkpoint that chains from it; return bytes freed."""
        doomed = {cp.key}
        for c in sorted(self._by_key.values(), key=lambda c: c.boundary.end):
            if c.boundary.parent in doomed:
                doomed.add(c.key)
        freed = 0
        with self._lock:
            for key in doomed:
                c = self._by_key.pop(key, None)
                if c is not None:
                    freed += c.nbytes
                    self._forget(c)
                    self._evicted[key] = None
            while len(self._evicted) > _TOMBSTONES:
                self._evicted.popitem(last=False)
        log.debug("evicted %d checkpoint(s) from %s, %d bytes", len(doomed), cp.key, freed)
        return freed

    def _forget(self, cp: Checkpoint) -> None:
        if cp in self._line:
            del self._line[self._line.index(cp):]
