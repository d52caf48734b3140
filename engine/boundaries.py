"""Where a prompt's checkpoints go and what identifies each one.

A boundary's key is a chained xxh3 over (policy fingerprint, the token ids of
every segment up to the boundary), so equal keys mean equal prefixes under the
same policy. Where the boundaries go is a function of the segment layout only:
the segments' kinds (`engine.request.SegmentKind`: anchors, protection) and
the checkpoint grid.
"""
from __future__ import annotations

import array
import bisect
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import xxhash

from engine.request import SegmentKind, SegmentLike, segment_kind

_NATIVE_U32 = sys.byteorder == "little" and array.array("I").itemsize == 4


def token_bytes(token_ids: Iterable[int]) -> bytes:
    """Token ids as little-endian uint32 bytes (what hashes and stores compare). Python ints, where the machine's
    own unsigned int is that, by `array` (a 131k-token prompt's boundaries, all its segments new, in 1.16 ms on a
    2-core CPU, against 4.30 through NumPy: `python bench/host_time.py`; an id outside uint32 raises OverflowError
    on both paths); a NumPy array through NumPy."""
    if _NATIVE_U32 and not isinstance(token_ids, np.ndarray):
        return array.array("I", token_ids).tobytes()
    ids = np.asarray(token_ids if isinstance(token_ids, np.ndarray) else list(token_ids))
    if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):  # NumPy would wrap them
        raise OverflowError(f"token ids outside uint32: {ids.min()}..{ids.max()}")
    return ids.astype("<u4").tobytes()


def _chain(prev: str, tokens: bytes) -> str:
    return xxhash.xxh3_64_hexdigest(prev.encode() + tokens)


@dataclass(frozen=True)
class Boundary:
    """The end of one non-empty segment of a request.

    Attributes:
        key: Chained hash over (policy fingerprint, tokens up to `end`).
        token_key: The same chain without the policy (to name policy mismatches).
        parent: Key of the previous boundary ("" for the first).
        start: First token position of the segment.
        end: Token position just after the segment.
        tokens: The segment's token ids (`token_bytes`).
        kind: The segment's kind.
        protected: Evicted last.
    """

    key: str
    token_key: str
    parent: str
    start: int
    end: int
    tokens: bytes
    kind: SegmentKind
    protected: bool


JOIN_TOKENS = 64
"""The longest segment the response header joins (`cut_points`)."""


def cut_points(segments: Sequence[SegmentLike], interval: int | None = None) -> list[int]:
    """Where checkpoints go (and prefill chunks restart): a function of the layout only.

    Without `interval`, at the end of every non-empty segment. With it, on a
    grid of `interval` tokens that restarts at every *anchor*: the end of a
    protected segment, of every segment of an anchor kind (`SegmentKind.anchor`:
    hot file, turn, question, header, answer) and of the segment before one.
    Repository files therefore cost no extra forward calls however many there
    are, an edit (a hot copy at the tail) keeps the whole stable prefix, and a
    follow-up question keeps the whole prefix.

    The response header joins a short segment before it (a question, a turn
    of at most `JOIN_TOKENS`): no cut between them unless that segment is part
    of the repository prefix or asks for protection with its own flag (beyond
    its kind's). The header is a few tokens that always follow, so the pair is
    one forward call instead of two (every forward reads all the weights and,
    at a long context, attends over all of it). What that gives up: a
    regenerate of the same prompt recomputes the short question with the
    header instead of the header alone (the joined forward of 45 tokens at 128k
    tokens on the H200 took 0.146-0.167 s in runs j-l; docs/benchmarks.md,
    *GPU engine*, sixth session). A long
    segment (a file pasted as the message) keeps its cut, so a repeat
    restores it.
    """
    ends, pos = [], 0
    for seg in segments:
        pos += len(seg.token_ids)
        ends.append(pos)
    total = pos
    kinds = [segment_kind(seg) for seg in segments]
    joined = {ends[i] for i in range(len(segments) - 1)
              if _header_joins(segments[i], kinds[i], segments[i + 1], kinds[i + 1])}
    if interval is None:
        return sorted({e for e in ends if e > 0} - joined)
    anchors = set()
    for i, seg in enumerate(segments):
        next_anchor = i + 1 < len(segments) and kinds[i + 1].anchor
        if seg.protected or kinds[i].protected or kinds[i].anchor or next_anchor:
            anchors.add(ends[i])
    anchors -= joined
    anchors.add(total)
    cuts, start = [], 0
    for anchor in sorted(a for a in anchors if a > 0):
        cuts.extend(range(start + interval, anchor, interval))
        cuts.append(anchor)
        start = anchor
    return cuts


def _header_joins(seg: SegmentLike, kind: SegmentKind, nxt: SegmentLike, next_kind: SegmentKind) -> bool:
    """Whether `nxt` (of `next_kind`) is a response header that joins `seg` (of `kind`): no cut between
    them (`cut_points`)."""
    return (next_kind is SegmentKind.HEADER
            and len(nxt.token_ids) > 0
            and 0 < len(seg.token_ids) <= JOIN_TOKENS
            and not kind.stable
            and not (seg.protected and not kind.protected))  # a protection of its own keeps the cut


def boundaries(policy_fingerprint: str, segments: Sequence[SegmentLike],
               interval: int | None = None,
               layout_key: Callable[[int], int] | None = None) -> list[Boundary]:
    """Boundaries at `cut_points(segments, interval)`, with their chained keys.

    A boundary's kind is that of the segment holding its last token; it is
    protected when it ends a protected segment (its own flag or its kind's).

    Args:
        policy_fingerprint: Seeds the chain.
        segments: The prompt layout.
        interval: The checkpoint grid (see `cut_points`).
        layout_key: When the state at a position depends on the layout beyond
            the tokens before it (windowed prefill: where the dense tail
            starts), maps a boundary's end to a number folded into its key.
    """
    ends, pos = [], 0
    for seg in segments:
        pos += len(seg.token_ids)
        ends.append(pos)
    blob = _SegmentBytes.joined(segments)
    out: list[Boundary] = []
    key, token_key, start, parent = policy_fingerprint, "", 0, ""
    for end in cut_points(segments, interval):
        tokens = blob[4 * start:4 * end]
        salt = b"" if layout_key is None else layout_key(end).to_bytes(8, "little", signed=True)
        key, token_key = _chain(key, tokens + salt), _chain(token_key, tokens)
        i = bisect.bisect_left(ends, end)  # the first segment that reaches `end` holds its last token
        seg = segments[i]
        kind = segment_kind(seg)
        protected = ends[i] == end and (seg.protected or kind.protected)
        out.append(Boundary(key, token_key, parent, start, end, tokens, kind, protected))
        parent, start = key, end
    return out


class _SegmentBytes:
    """Each segment's `token_bytes`, kept from one prompt to the next by the identity of its token tuple.

    A prompt's segments are mostly the ones the last prompt had (the repository prefix): a 131k-token prompt's
    boundaries take 0.29 ms with the bytes kept against 1.16 ms with every segment new on a 2-core CPU
    (`python bench/host_time.py`).
    Only tuples are kept (they cannot change); the map holds the last prompt's segments only, and is replaced
    whole, so threads that plan at once (`Engine.probe`) see one map or the other, each of them right.
    """

    _last: dict[int, tuple[tuple[int, ...], bytes]] = {}

    @classmethod
    def joined(cls, segments: Sequence[SegmentLike]) -> bytes:
        last, now = cls._last, {}
        parts = []
        for seg in segments:
            ids = seg.token_ids
            if type(ids) is not tuple:
                parts.append(token_bytes(ids))
                continue
            hit = last.get(id(ids))
            data = hit[1] if hit is not None and hit[0] is ids else token_bytes(ids)
            now[id(ids)] = (ids, data)
            parts.append(data)
        cls._last = now
        return b"".join(parts)
