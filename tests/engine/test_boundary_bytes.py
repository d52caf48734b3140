"""`engine.boundaries.boundaries` keeps each segment's token bytes from one prompt to the next; its boundaries are
those of the plain computation (every token's bytes made again for every prompt) whatever the layout, and a segment
whose tokens changed is never read from the kept bytes."""
from __future__ import annotations

import random

import xxhash

from engine.boundaries import boundaries, cut_points
from engine.request import PromptSegment, segment_kind

KINDS = ("system", "file", "file", "hot", "turn", "question", "header", "answer")


def _plain(fingerprint: str, segments, interval=None, layout_key=None) -> list[tuple]:
    """The boundaries by definition: the bytes of every token up to each cut, chained."""
    ids = [t for s in segments for t in s.token_ids]
    owner = [s for s in segments for _ in s.token_ids]
    ends, pos = set(), 0
    for s in segments:
        pos += len(s.token_ids)
        ends.add(pos)
    out, key, token_key, start, parent = [], fingerprint, "", 0, ""
    for end in cut_points(segments, interval):
        tokens = b"".join(t.to_bytes(4, "little") for t in ids[start:end])
        salt = b"" if layout_key is None else layout_key(end).to_bytes(8, "little", signed=True)
        key = xxhash.xxh3_64_hexdigest(key.encode() + tokens + salt)
        token_key = xxhash.xxh3_64_hexdigest(token_key.encode() + tokens)
        seg = owner[end - 1]
        kind = segment_kind(seg)
        out.append((key, token_key, parent, start, end, tokens, kind, end in ends and (seg.protected or kind.protected)))
        parent, start = key, end
    return out


def _layout(rng: random.Random, n: int) -> list[PromptSegment]:
    return [PromptSegment(rng.choice(KINDS), f"k{i}", tuple(rng.randrange(2**32) for _ in range(rng.choice((0, 1, 3, 40, 300)))),
                          protected=rng.random() < 0.2) for i in range(n)]


def _fields(bs) -> list[tuple]:
    return [(b.key, b.token_key, b.parent, b.start, b.end, b.tokens, b.kind, b.protected) for b in bs]


def test_boundaries_equal_the_plain_computation_over_random_layouts_grids_and_salts():
    rng = random.Random(7)
    for trial in range(40):
        segments = _layout(rng, rng.randrange(1, 12))
        if not any(s.token_ids for s in segments):
            continue
        interval = rng.choice((None, 16, 128))
        salt = None if trial % 2 else (lambda end: end // 5 - 3)
        assert _fields(boundaries("fp", segments, interval, salt)) == _plain("fp", segments, interval, salt)


def test_a_segment_kept_from_the_last_prompt_or_changed_since_gives_the_plain_boundaries():
    rng = random.Random(11)
    segments = _layout(rng, 8)
    boundaries("fp", segments, 64)  # keeps these segments' bytes
    again = list(segments)
    again[3] = PromptSegment(segments[3].kind, segments[3].key, tuple(t ^ 1 for t in segments[3].token_ids) + (5,))
    again.append(PromptSegment("question", "q", (1, 2, 3)))
    listed = PromptSegment("file", "listed", (9, 8, 7))
    object.__setattr__(listed, "token_ids", [9, 8, 7])  # a list is never kept (it could change in place)
    again.insert(2, listed)
    assert _fields(boundaries("fp", again, 64)) == _plain("fp", again, 64)
    listed.token_ids[0] = 4
    assert _fields(boundaries("fp", again, 64)) == _plain("fp", again, 64)
    assert _fields(boundaries("fp", segments, 64)) == _plain("fp", segments, 64)  # back to the first prompt
