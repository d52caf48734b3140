"""`PrefixCache`: the engine's live cache plus its checkpoints, as one prefill step.

    prefix = PrefixCache(model, policy, kv_bits=16)
    logits = prefix.prefill(request, chunk, should_cancel, metrics)  # restore + prefill + record
    ... decode on prefix.cache, calling prefix.record_decoded(generated) after each token ...
    prefix.rollback()   # after a cancel or an error: back to the last confirmed checkpoint

The prefill restores the longest valid checkpoint, then runs the rest with
chunks restarting at every segment boundary (so warm and cold runs make the
same forward calls) and records a checkpoint as each segment completes.

With a window policy (`engine.window`), each request first sets where its
dense tail starts (a function of its segment layout) on the window caches,
and that position is folded into every boundary key it affects.

`probe` answers, from any thread and without MLX work, how much of a prompt
a request could restore now and why not more; `warm_prefix` is the repository
prefix the cache last prefilled, while it still holds it.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import mlx.core as mx

from engine import qkv, state
from engine.archive import CheckpointArchive
from engine.boundaries import Boundary
from engine.checkpoint_types import Checkpoint, Miss
from engine.checkpoints import CheckpointStore
from engine.compute import path_of
from engine.generate import CancelCheck, make_room, prefill
from engine.kv import make_cache
from engine.policy import CachePolicy
from engine.request import Metrics, Probe, PromptSegment, Request, SegmentKind, SegmentLike, stable_part
from engine.window import set_dense_from

log = logging.getLogger(__name__)


def default_budget_bytes(fraction: float = 0.125) -> int:
    """A checkpoint budget from the memory this process can use (`engine.machine.total_memory`: a
    container's limit where it has one); 1/8 by default, 1 GiB if unknown."""
    from engine.machine import total_memory

    total = total_memory()
    return int(total * fraction) if total else 1 << 30


def model_dtype(model: Any) -> str:
    """The dtype of the model's first floating parameter, e.g. "float32"."""
    from mlx.utils import tree_flatten

    for _, p in tree_flatten(model.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return str(p.dtype).removeprefix("mlx.core.")
    return "unknown"


class PrefixCache:
    """The live cache of one engine and the checkpoints over it (MLX thread only).

    Args:
        model: The engine's `engine.compute.ComputePath`, or a bare mlx-lm
            model (its exact MLX call).
        policy: The cache policy (its fingerprint keys every checkpoint).
        budget_bytes: Bytes checkpoints may own; `default_budget_bytes()` when None.
        archive_bytes: Size cap of the disk archive; 0 keeps checkpoints in memory only.
        archive_root: Archive root (default ``CODECTX_HOME/archive``).
        cache: The live per-layer cache to use (e.g. window caches); by default
            `engine.kv.make_cache` with the policy's KV bits. Its layers must
            speak the trim/offset/state vocabulary (see `engine.state`).
        window: The `engine.window.WindowPolicy` of `cache` (its layers must be
            window caches); None for caches that attend densely.
        rebuild: Makes a fresh live cache like `cache` (its None standing, as for `cache`, for
            `engine.kv.make_cache`), for a rollback that fails; without it such a failure is raised.
        room_limit: Positions the live cache never holds more of (the model's context; None: not known): room
            made in its buffers stops there (`room`: with the compute path's room ahead, `engine.qkv.Room`).
    """

    def __init__(self, model: Any, policy: CachePolicy, *, budget_bytes: int | None = None,
                 archive_bytes: int = 0, archive_root: Any = None, cache: list[Any] | None = None,
                 window: Any = None, rebuild: Callable[[], list[Any] | None] | None = None,
                 room_limit: int | None = None) -> None:
        self.compute = path_of(model)
        self.model = self.compute.model
        self._budget_bytes = default_budget_bytes() if budget_bytes is None else budget_bytes
        self._archive_bytes = archive_bytes
        self._archive_root = archive_root
        self._retired: frozenset[str] = frozenset()  # token keys checkpointed under an earlier policy
        # The last prompt's layout, length and layout key (for checkpoints during decode).
        self._decoding: tuple[list[SegmentLike], int, Any] = ([], 0, None)
        self._last_prefix: tuple[SegmentLike, ...] = ()  # see `warm_prefix`
        self._stats_lock = threading.Lock()
        self._stats: dict[str, Any] = {}
        self._rebuild = rebuild
        self.room = qkv.Room(self.compute.room_ahead, room_limit)  # how far its buffers reach past its rows
        self._use(policy, cache, window)

    def _use(self, policy: CachePolicy, cache: list[Any] | None, window: Any) -> None:
        self.policy = policy
        self.window = window if window is not None and window.enabled else None
        fingerprint = policy.fingerprint()
        off = getattr(getattr(self, "archive", None), "off_reason", None)  # off stays off
        self.archive = (CheckpointArchive(fingerprint, self._archive_bytes, self._archive_root, off)
                        if self._archive_bytes > 0 else None)
        self.store = CheckpointStore(fingerprint, self._budget_bytes, archive=self.archive,
                                     interval=policy.prefill_chunk)
        self.cache = cache if cache is not None else make_cache(self.model, policy.kv_bits,
                                                                policy.kv_group_size)
        self._view = (self.store, self.window)  # one policy's store and window, for `probe`
        self._update_stats()

    def request_scope(self) -> contextlib.AbstractContextManager[None]:
        """The context one request runs in: archive writes wait until it ends (`CheckpointArchive.paused`)."""
        return self.archive.paused() if self.archive is not None else contextlib.nullcontext()

    def switch_policy(self, policy: CachePolicy, cache: list[Any] | None = None,
                      window: Any = None) -> None:
        """Serve later requests under another policy (e.g. approximation switched off).

        Checkpoints of the old policy are dropped; a later request over the same
        tokens reports the miss as "policy mismatch".

        Args:
            policy: The new cache policy.
            cache: A fresh live cache for it (default `engine.kv.make_cache`).
            window: The window policy of `cache`, if any.
        """
        self._retired = self._retired | {cp.boundary.token_key for cp in self.store.checkpoints()}
        if self.archive is not None:
            self.settle_archive()
            self.archive.close()
        self._decoding = ([], 0, None)
        self._last_prefix = ()
        self._use(policy, cache, window)

    def _layout_key(self, request: Request, n_tokens: int) -> Callable[[int], int] | None:
        """Set the request's dense start on the window caches; its boundary-key salt."""
        window = self.window
        if window is None:
            return None
        dense_from = window.dense_from(request.segments) if request.segments else window.dense_from_ids(n_tokens)
        set_dense_from(self.cache, dense_from)
        return lambda end: window.layout_key(end, dense_from)

    def probe(self, segments: Sequence[SegmentLike]) -> Probe:
        """How much of `Request(segments=segments)` could be restored now, and why not more.

        The walk a request's restore makes, over every boundary (the last one
        too), against the checkpoints in memory and the archive's index. Safe
        from any thread: no MLX work, no archive file read (an entry is checked
        when a request loads it). A window change not applied yet is not seen.
        """
        segments = list(segments)
        ends = list(itertools.accumulate(len(s.token_ids) for s in segments))
        total = ends[-1] if ends else 0
        store, window = self._view
        layout_key = None
        if window is not None:
            dense_from = window.dense_from(segments)
            layout_key = lambda end: window.layout_key(end, dense_from)  # noqa: E731
        bounds = store.boundaries(segments, layout_key)
        plan = store.plan(bounds, total + 1)
        warm = plan.offset
        from_memory = plan.path[-1].boundary.end if plan.path else 0
        miss = self._name_policy_switch(plan.miss, bounds, warm)
        return Probe(prompt_tokens=total, warm_tokens=warm, archived_tokens=warm - from_memory if plan.archived else 0,
                     warm_segments=sum(end <= warm for end in ends), miss=str(miss) if miss else None)

    def warm_prefix(self) -> tuple[SegmentLike, ...]:
        """The repository prefix last prefilled, while this cache still holds all of it.

        That is the leading stable segments (`SegmentKind.stable`) of the latest
        request whose stable part was confirmed on the live cache (prefilled or
        restored whole); () when there was none, or part of it is gone since.
        Safe from any thread.
        """
        prefix = self._last_prefix
        return prefix if prefix and self.probe(prefix).warm else ()

    def _note_prefix(self, segments: Sequence[SegmentLike]) -> None:
        """Remember `segments`' stable part when the live cache now holds it whole."""
        stable = stable_part(segments)
        end = sum(len(s.token_ids) for s in stable)
        if end and self.store.line_offset >= end:
            self._last_prefix = tuple(stable)

    def prefill(self, request: Request, chunk_size: int, should_cancel: CancelCheck,
                metrics: Metrics,
                on_chunk: Callable[[int, int], None] | None = None) -> mx.array:
        """Restore what is cached, prefill the rest, record each finished segment.

        Fills `metrics.cached_tokens`, `recomputed_tokens` (tokens actually
        prefilled, also when cancelled), `miss_reason` and `checkpoint_bytes`.

        Returns:
            Logits of the last prompt position, shape (1, vocab).

        Raises:
            RequestCancelled: From `should_cancel`; call `rollback()` afterwards.
        """
        n_tokens = request.prompt_length()
        segments = list(request.segments or [PromptSegment(SegmentKind.PROMPT, "", tuple(request.prompt_ids or ()))])
        layout_key = self._layout_key(request, n_tokens)
        self._decoding = (segments, n_tokens, layout_key)
        bounds = self.store.boundaries(segments, layout_key)
        plan = self.store.plan(bounds, n_tokens)
        began = time.perf_counter()
        offset, miss = self.store.restore(self.cache, plan, room_until=self.room.end(n_tokens))
        restore_s = time.perf_counter() - began
        log.debug("restore: %d tokens, %.4f s (queued work included where it was waited for)", offset, restore_s,
                  extra={"restore_s": restore_s})
        miss = self._name_policy_switch(miss, bounds, offset)
        metrics.cached_tokens = offset
        metrics.recomputed_tokens = 0
        metrics.miss_reason = str(miss) if miss else None
        pending = [b for b in bounds if b.end > offset]

        def confirm(done: int, total: int) -> None:
            metrics.recomputed_tokens = done
            while pending and pending[0].end <= offset + done:
                b, began = pending.pop(0), time.perf_counter()
                self.store.record(self.cache, b)
                if log.isEnabledFor(logging.DEBUG):  # benchmarks read `record` (bench/request_profile.ForwardLog)
                    seconds = time.perf_counter() - began
                    log.debug("record [%d, %d): %.4f s (its archive copy comes later: CheckpointStore.settle)",
                              b.start, b.end, seconds, extra={"record": (b.end - b.start, seconds)})
            if on_chunk is not None:
                on_chunk(offset + done, n_tokens)

        try:
            logits = prefill(self.compute, self.cache, request.token_ids_from(offset), chunk_size, should_cancel,
                             boundaries=[b.end - offset for b in pending], on_chunk=confirm, room=self.room)
        finally:
            metrics.checkpoint_bytes = self.store.nbytes
            self._note_prefix(segments)
            self._update_stats()
        log.debug("prefill %s: %d cached, %d recomputed, miss=%s", request.request_id,
                  offset, n_tokens - offset, metrics.miss_reason)
        return logits

    def record_decoded(self, generated: Sequence[int]) -> Checkpoint | None:
        """Checkpoint a long generation every `policy.prefill_chunk` tokens (call after each token).

        The boundary is the one a later prompt gets when it carries the answer as a
        segment right after the response header (`[...][header][answer]`), so a
        continuation restores it; a cancel rolls back to it, not to the prompt.

        Args:
            generated: Every token yielded so far for the last prefilled request; the
                cache holds the prompt plus a prefix of them.

        Returns:
            The checkpoint, or None when the cache is not on the grid (or not on the line).
        """
        segments, prompt_len, layout_key = self._decoding
        interval = self.policy.prefill_chunk
        done = state.attention_offset(self.cache) - prompt_len
        if done <= 0 or done % interval or done > len(generated) or self.store.line_offset != prompt_len + done - interval:
            return None
        answer = PromptSegment(SegmentKind.ANSWER, "answer", tuple(generated[:done]))
        b = self.store.boundaries([*segments, answer], layout_key)[-1]
        cp = self.store.record(self.cache, replace(b, protected=True))
        self._update_stats()
        return cp

    def _name_policy_switch(self, miss: Miss | None, bounds: list[Boundary], offset: int) -> Miss | None:
        """A "new prefix" whose tokens were checkpointed under a retired policy is a policy mismatch."""
        if miss is None or miss.kind != "new prefix" or not self._retired:
            return miss
        first = next((b for b in bounds if b.end > offset), None)
        return Miss("policy mismatch") if first is not None and first.token_key in self._retired else miss

    def rollback(self) -> int:
        """Drop unconfirmed state; return the tokens of confirmed state kept.

        A live cache that cannot be trimmed back (a failure left a layer in a state the
        checkpoints do not describe) is replaced by a fresh one from `rebuild`, and this
        policy's checkpoints with it: later requests recompute instead of reading bad state.
        """
        try:
            kept = self.store.rollback(self.cache)
        except Exception:  # the engine's worker must outlive any one request's failure
            if self._rebuild is None:
                raise
            log.exception("the live cache could not be rolled back; it starts afresh")
            self.store.forget_owed()  # its rows are not known to be the checkpoints' any more
            self.switch_policy(self.policy, self._rebuild(), self.window)
            kept = 0
        self._update_stats()
        return kept

    def stats(self) -> dict[str, Any]:
        """Checkpoints, memory and archive, as of the last request (any thread)."""
        with self._stats_lock:
            return dict(self._stats)

    def settle(self, stop: Callable[[], bool] | None = None) -> int:
        """The work between requests, until `stop()`: the archive's copies still owed, then the line's one-off
        tail copied ahead of the next request (`CheckpointStore.copy_ahead`), then room for the next request's rows
        in the live cache's buffers (`_room_ahead`); how many copies or layers are still to do.
        Call it on the thread that runs the requests (the engine's worker does, while none waits)."""
        owed = self.settle_archive(stop)
        if owed:
            return owed
        left = self.store.copy_ahead(self.cache, stop)
        if not left:
            left = self._room_ahead(stop)
        self._update_stats()
        return left

    def _room_ahead(self, stop: Callable[[], bool] | None) -> int:
        """`room.ahead` positions past the live cache's offset in every layer's buffers where fewer than half of
        them are left (none where the path keeps no room), one layer at a time (its new buffers evaluated before
        the next grows, so the old ones can go first) until `stop()`; how many layers are still to grow. Half, not
        all: the buffers keep one capacity over many requests, and the traced decode step one trace
        (`engine.qkv.ROOM_AHEAD`)."""
        layers = [layer for layer in self.cache if hasattr(layer, "make_room")]
        for done, layer in enumerate(layers):
            if stop is not None and stop():
                return len(layers) - done
            grown = make_room([layer], 0, least=self.room.ahead // 2, room=self.room)
            if grown:
                mx.eval(grown)
        return 0

    def settle_archive(self, stop: Callable[[], bool] | None = None) -> int:
        """Make the archive's copies still owed (`CheckpointStore.settle`) until `stop()`; how many are still owed.
        Call it on the thread that runs the requests, between them (the engine's worker does, while none waits).
        A copy that fails is skipped there, so this does not raise for one."""
        return self.store.settle(self.cache, stop=stop)

    def close(self) -> None:
        """Finish archive writes (the copies still owed first: call it on the thread that ran the requests, or
        after `settle_archive` there)."""
        if self.archive is not None:
            self.settle_archive()
            self.archive.close()

    def _update_stats(self) -> None:
        cps = self.store.checkpoints()
        stats = {
            "policy": self.policy.fingerprint(),
            "approximation": self.policy.approximation,
            "checkpoints": len(cps),
            "checkpoint_bytes": self.store.nbytes,
            "budget_bytes": self.store.budget_bytes,
            "live_tokens": self.store.line_offset,
            "live_cache_bytes": sum(int(getattr(c, "nbytes", 0) or 0) for c in self.cache
                                    if not state.is_recurrent(c)),
            "archive_entries": len(self.archive) if self.archive else 0,
            "archive_bytes": self.archive.nbytes if self.archive else 0,
            "checkpoint_list": [{"kind": c.boundary.kind, "end": c.boundary.end,
                                 "bytes": c.nbytes, "branch": not self.store.on_line(c)}
                                for c in cps],
        }
        with self._stats_lock:
            self._stats = stats
