"""Prefill and decode for one request, on the calling thread (the engine's worker).

- The model is called through a `engine.compute.ComputePath` (the path an
  engine chose once); a bare mlx-lm model means its own exact MLX call.
- `prefill` runs the prompt in chunks, in order, and returns the logits of
  the last position. Chunking restarts at every boundary given, so a caller
  that restores state at a boundary replays exactly the same forward calls.
  The host builds a chunk's graph while the one before runs on the device,
  and queues it once that one has finished.
- `decode` yields sampled token ids until EOS, `max_tokens` or cancellation. It is
  pipelined one step ahead: step n + 1 (the forward of token n, the next sampling) is
  built from the lazy token n and queued (``mx.async_eval``) before token n is read, so
  the host builds a step's graph while the device runs the previous one (on the H200, a
  64-layer model's step at 128k tokens went from 34.4 to 20.0 ms; docs/benchmarks.md,
  *GPU engine*). The first token is read before the second step is built: it is the
  time to first token. Tokens are those of the unpipelined loop. A caller that stops
  early, or an EOS, leaves the queued step's token in the cache. With a repetition
  penalty (counted on the host) each step waits for the token it counts.
- `StopStrings` turns text deltas into emitted text, holding back any tail
  that could still become a stop string.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Collection, Iterator, Sequence

import mlx.core as mx

from . import qkv, state
from .compute import ComputePath, path_of
from .errors import RequestCancelled
from .sampling import RepetitionPenalty, Sampler

DEFAULT_PREFILL_CHUNK = 256
"""Tokens per prefill forward call; 256 beat 2048 on the 2-core CPU."""

CancelCheck = Callable[[], bool]
ChunkCallback = Callable[[int, int], None]
"""Called after each prefill chunk with (tokens done, tokens total)."""

log = logging.getLogger(__name__)


def chunk_spans(n_tokens: int, chunk_size: int, boundaries: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Split [0, n_tokens) into chunks of at most `chunk_size`, restarting at boundaries.

    Args:
        n_tokens: Prompt length.
        chunk_size: Largest chunk.
        boundaries: Positions where a chunk must end (others are ignored when
            outside (0, n_tokens)).

    Returns:
        Consecutive (start, end) spans covering [0, n_tokens).

    Raises:
        ValueError: For chunk_size < 1.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    cuts = sorted({b for b in boundaries if 0 < b < n_tokens} | {n_tokens})
    spans, start = [], 0
    for cut in cuts:
        while start < cut:
            end = min(start + chunk_size, cut)
            spans.append((start, end))
            start = end
    return spans


def written_arrays(cache: Sequence[Any]) -> list[Any]:
    """What a forward wrote into `cache`, to evaluate (the prefill's chunks, a draft model's catch-up): a window
    cache's buffers as its store holds them (its `state` would hand out views, after which the next decode step's
    row could not be written in place and the step would leave its trace: `WindowKVCache.written`), any other
    cache's `state`."""
    return [c.written() if hasattr(c, "written") else c.state for c in cache]


def make_room(cache: Sequence[Any], rows: int, least: int = 0, room: qkv.Room = qkv.Room()) -> list[mx.array]:
    """Where fewer than `rows` + `least` positions are left past its offset, grow each window cache's buffers, once,
    to `rows` and `room.ahead` more past it, never past `room.limit` positions in all (the model's context: nothing
    is written past it); the new buffers (`WindowKVCache.make_room`; a cache without buffers yet, or another kind,
    is left alone). A write past the buffers grows them over the whole history, in steps of 256 positions: a
    131,072-token cold prefill in 2,048-row chunks ends every chunk at its buffers' end, so it grew the history 63
    times (28 ms a grow at its end for a 64-layer 8-bit cache on an H100, docs/benchmarks.md, thirty-third session);
    made room for the whole prompt once, it grows it once, and the answer's decode writes into room too."""
    grown = []
    for layer in cache:
        if hasattr(layer, "make_room"):
            end = max(layer.offset, room.end(layer.offset + rows))
            fit = min(rows + least, end - layer.offset)
            grown += layer.make_room(fit, ahead=end - layer.offset - fit)
    return grown


def keep_room(cache: Sequence[Any], rows: int, room: qkv.Room = qkv.Room()) -> None:
    """Before a step writes `rows` positions: where the first window cache's buffers would not hold them, make room
    in every window cache (`make_room`: `room.ahead` more, never past `room.limit`), not a 256-position grow of the
    whole history inside the step. One layer is asked each step (window caches grow together); the others only when it
    grew (a check per layer per step would loop over all of them at the model's context)."""
    first = next((c for c in cache if hasattr(c, "make_room")), None)
    if first is not None and make_room([first], rows, room=room):
        make_room(cache, rows, room=room)


def _forward_done(chunk: tuple[int, int], since: float) -> float:
    """Log a finished prefill forward, (rows, keys), timed from `since` (the forward before it finished: the time
    it added, its build overlapped); return now."""
    now = time.perf_counter()
    if log.isEnabledFor(logging.DEBUG):  # benchmarks read `forward` (bench/request_profile.ForwardLog)
        forward = (*chunk, now - since)
        log.debug("prefill forward: %d tokens, %d keys, %.4f s", *forward, extra={"forward": forward})
    return now


def prefill(
    compute: ComputePath | Any,
    cache: list[Any],
    token_ids: Sequence[int],
    chunk_size: int = DEFAULT_PREFILL_CHUNK,
    should_cancel: CancelCheck | None = None,
    *,
    boundaries: Sequence[int] = (),
    on_chunk: ChunkCallback | None = None,
    room: qkv.Room = qkv.Room(),
) -> mx.array:
    """Run the prompt through the model, filling `cache`.

    The cancel check runs before every chunk. On cancel the cache holds the chunks already done (the caller
    decides whether to keep or drop them); its buffers keep the room made for the whole prompt (`make_room`).

    Args:
        compute: The engine's `ComputePath`, or a bare mlx-lm model (its exact MLX call).
        cache: Per-layer cache (see `engine.kv.make_cache`); may already hold a prefix.
        token_ids: Tokens to add after what the cache holds; at least one.
        chunk_size: Largest number of tokens per forward call.
        should_cancel: Returns True to stop.
        boundaries: Positions (relative to `token_ids`) where a chunk must end.
        on_chunk: Progress callback, run after each chunk on this thread.
        room: How far past the prompt its buffers reach (`make_room`; the path's room, the model's context).

    Returns:
        Logits of the last position, shape (1, vocab), evaluated.

    Raises:
        ValueError: For an empty `token_ids`.
        RequestCancelled: When `should_cancel` returned True.
    """
    if len(token_ids) == 0:
        raise ValueError("prefill needs at least one token")
    path, ids = path_of(compute), mx.array(list(token_ids), dtype=mx.uint32)[None]
    logits, running, mark = None, None, time.perf_counter()
    cold = all(c.offset == 0 for c in cache if hasattr(c, "make_room"))
    make_room(cache, len(token_ids), room=room)  # buffers that exist: before the first write
    for start, end in chunk_spans(len(token_ids), chunk_size, boundaries):
        if should_cancel is not None and should_cancel():
            raise RequestCancelled(f"cancelled during prefill at token {start}")
        # Built while the chunk before runs, queued once it finished (`mx.synchronize`): a KV write is in place only if
        # no queued work reads the buffer (queuing ahead: a 128k peak of 124 GiB, not 98; docs/benchmarks.md, GPU).
        out = path.forward(ids[:, start:end], cache, logits="last" if (last := end == len(token_ids)) else "none")
        if start == 0 and cold:  # the buffers exist now and hold one chunk: room for the prompt and its answer
            make_room(cache, len(token_ids) - end, least=room.ahead // 2, room=room)
        if running is not None:
            mx.synchronize()
            mark = _forward_done(running, mark)
        running = (end - start, state.attention_offset(cache) if log.isEnabledFor(logging.DEBUG) else 0)
        if last:
            logits = out[:, -1, :]
            mx.eval(logits, written_arrays(cache))
            mark = _forward_done(running, mark)
        else:
            mx.async_eval(written_arrays(cache))
        if on_chunk is not None:  # (a chunk's checkpoint needs its position only: `CheckpointStore.record`)
            on_chunk(end, len(token_ids))
    return logits


def decode(
    compute: ComputePath | Any,
    cache: list[Any],
    logits: mx.array,
    sampler: Sampler,
    max_tokens: int,
    eos_token_ids: Collection[int] = (),
    should_cancel: CancelCheck | None = None,
    penalty: RepetitionPenalty | None = None,
    room: qkv.Room = qkv.Room(),
) -> Iterator[int]:
    """Sample tokens one by one from the prefill's last logits, pipelined one step ahead (module docstring).

    The EOS token is not yielded; it ends the loop. The cancel check runs before every step.
    The cache receives every yielded token, except the last when `max_tokens` ends the loop
    and the first until the second is asked for (rollbacks go by checkpoints, not by count).

    Args:
        compute: The engine's `ComputePath`, or a bare mlx-lm model (its exact MLX call).
        cache: The cache `prefill` filled.
        logits: Logits of the last prompt position, shape (1, vocab).
        sampler: Chooses a token from logits.
        max_tokens: Most tokens to yield.
        eos_token_ids: Ids that end the generation.
        should_cancel: Returns True to stop.
        penalty: Applied to the logits before `sampler`, counting each yielded token.
        room: The path's room and the model's context: a step that would write past its window caches' buffers
            first grows them by `room.ahead` more (`keep_room`), not by the write's 256 positions, so a long answer
            grows them (and the traced step is traced again) once, not every 256 tokens.

    Yields:
        Token ids.

    Raises:
        RequestCancelled: When `should_cancel` returned True.
    """
    steps = _Steps(path_of(compute), cache, sampler, penalty, room)
    if max_tokens < 1:
        return
    token = steps.sample(logits)
    mx.async_eval(token)
    for step in range(max_tokens):
        if should_cancel is not None and should_cancel():
            raise RequestCancelled(f"cancelled during decode at token {step}")
        more = step + 1 < max_tokens
        # Without a penalty step n + 1 needs nothing from the host: queued from the lazy token before that
        # token is read. The first token (what the user waits for) is yielded before any step is built.
        ahead = more and step > 0
        nxt = steps.after(token) if ahead and penalty is None else None
        token_id = steps.read(token)
        if token_id in eos_token_ids:
            return
        if penalty is not None:
            penalty.observe((token_id,))
            nxt = steps.after(token) if ahead else None
        yield token_id
        token = steps.after(token) if more and step == 0 else nxt


class _Steps:
    """`decode`'s steps: building and queuing one, reading a token. With DEBUG logging on, a token read after
    a step was built logs the host's seconds (`decode_step`: building the step last queued, submitting it
    with `mx.async_eval`, waiting for the token), which the benchmarks read (bench/request_profile.ForwardLog).
    Pipelined, the step last queued is the next token's; with a repetition penalty, this token's."""

    def __init__(self, path: ComputePath, cache: list[Any], sampler: Sampler, penalty: RepetitionPenalty | None,
                 room: qkv.Room = qkv.Room()):
        self.path, self.cache, self.sampler, self.penalty, self.room = path, cache, sampler, penalty, room
        self.timed = log.isEnabledFor(logging.DEBUG)
        self.host: tuple[float, float] | None = None  # the step built since the last token read

    def sample(self, logits: mx.array) -> mx.array:
        """The next token (lazy) from `logits`, with the request's penalty."""
        return self.sampler(logits if self.penalty is None else self.penalty.apply(logits))

    def after(self, token: mx.array) -> mx.array:
        """Build and queue the step that follows `token` (its forward and sampling); its token, lazy."""
        began = time.perf_counter()
        keep_room(self.cache, 1, self.room)
        nxt = self.sample(self.path.forward(token.reshape(1, 1), self.cache, logits="last")[:, -1, :])
        built = time.perf_counter()
        mx.async_eval(nxt)
        self.host = (built - began, time.perf_counter() - built)
        return nxt

    def read(self, token: mx.array) -> int:
        """The token's id, once the device has it."""
        waited = time.perf_counter()
        token_id = int(token.item())
        if self.timed and self.host is not None:
            timing = (*self.host, time.perf_counter() - waited)
            log.debug("decode step: build %.4f s, submit %.4f s, wait %.4f s", *timing, extra={"decode_step": timing})
        self.host = None
        return token_id


class StopStrings:
    """Cuts generated text at the first stop string, across any split into deltas.

    Text that could still be the start of a stop string is held back until
    the next delta decides it.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""
        self.stopped = False

    def push(self, delta: str) -> str:
        """Add a delta; return the text that is now safe to emit.

        After a stop string is found, `stopped` is True and further deltas
        are ignored.
        """
        if self.stopped:
            return ""
        self._pending += delta
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self._pending = self._pending[: min(hits)], ""
            return out
        keep = self._held_back_length()
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def flush(self) -> str:
        """Return what is held back (the generation ended without a stop string)."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _held_back_length(self) -> int:
        """Length of the longest tail of the pending text that starts some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:n]):
                    longest = n
                    break
        return longest
