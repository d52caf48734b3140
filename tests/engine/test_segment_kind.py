"""One segment vocabulary: `SegmentKind`'s properties, and context's segments going into the engine as they are.

(That the answers over context's segments equal a cold engine's: tests/engine/test_checkpoint_edit.py.)
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest

from checkpoint_helpers import run
from context.workspace import Workspace
from engine.archive_entry import ArchiveEntry
from engine.boundaries import JOIN_TOKENS, boundaries, cut_points
from engine.engine import Engine
from engine.request import PromptSegment, Request, SegmentKind
from engine.window import WindowPolicy

K = SegmentKind
# kind: (stable, dense, anchor, protected, archived)
PROPERTIES = {
    K.SYSTEM: (True, False, False, False, True),
    K.TOOLS: (True, False, False, False, True),
    K.MAP: (True, False, False, False, True),
    K.FILE: (True, False, False, False, True),
    K.HOT: (True, True, True, False, True),
    K.FOCUS: (False, True, True, False, True),
    K.TURN: (False, True, True, False, True),
    K.QUESTION: (False, True, True, True, False),
    K.HEADER: (False, True, True, True, False),
    K.ANSWER: (False, True, True, False, False),
    K.PROMPT: (False, False, False, False, True),
}
FILES = {"README.md": "# calc\n", "calc/parse.py": "def tokens(text):\n    return text.split()\n"}


def test_every_kind_has_its_properties():
    assert set(PROPERTIES) == set(SegmentKind)
    for kind, expected in PROPERTIES.items():
        assert (kind.stable, kind.dense, kind.anchor, kind.protected, kind.archived) == expected, kind


def test_kinds_read_as_plain_names():
    assert SegmentKind("header") is K.HEADER and K.FILE == "file" and f"{K.HOT}" == "hot"
    assert json.loads(json.dumps({"kind": K.QUESTION})) == {"kind": "question"}
    assert msgpack.unpackb(msgpack.packb([K.ANSWER])) == ["answer"]


def test_prompt_segment_takes_a_name_and_its_kind_decides_protection():
    header = PromptSegment("header", "h", (1,))
    assert header.kind is K.HEADER and header.protected
    assert not PromptSegment("file", "a.py", (1,)).protected
    assert PromptSegment("system", "s", (1,), protected=True).protected  # a segment may ask for more
    with pytest.raises(ValueError, match="unknown segment kind 'prefix'"):
        PromptSegment("prefix", "", (1,))


def test_request_refuses_a_segment_of_an_unknown_kind():
    class Foreign:  # a caller's own segment type with a name the engine does not know
        kind, key, token_ids, protected = "chapter", "1", (1, 2), False

    with pytest.raises(ValueError, match="unknown segment kind 'chapter'"):
        Request(segments=[Foreign()])


def test_anchors_and_protection_follow_the_kind():
    layout = [PromptSegment(kind, kind.value, (1, 2, 3)) for kind in
              (K.SYSTEM, K.FILE, K.FILE, K.HOT, K.TURN, K.HEADER, K.ANSWER, K.QUESTION, K.HEADER)]
    # A grid of 2 restarting at every anchor: the file before the hot copy (9), then every tail segment
    # but the two a header follows (the turn ending at 15, the question at 24): a header joins them.
    assert cut_points(layout, interval=2) == [2, 4, 6, 8, 9, 11, 12, 14, 16, 18, 20, 21, 23, 25, 27]
    assert [b.end for b in boundaries("p", layout) if b.protected] == [18, 27]  # the headers
    assert cut_points(layout) == [3, 6, 9, 12, 18, 21, 27]  # without a grid too
    shared_turn = [*layout[:4], PromptSegment(K.TURN, "t", (1, 2, 3), protected=True), *layout[5:]]
    assert 15 in cut_points(shared_turn, interval=2)  # a segment's own protection keeps its cut
    assert cut_points(layout[:3] + layout[-1:]) == [3, 6, 9, 12]  # and so does the repository prefix's end
    long = [*layout[:7], PromptSegment(K.QUESTION, "q", tuple(range(JOIN_TOKENS + 1))), layout[8]]
    assert 21 + JOIN_TOKENS + 1 in cut_points(long)  # a long question (a pasted file) keeps its cut
    empty = [*layout[:3], PromptSegment(K.QUESTION, "q", ()), layout[8]]
    assert 9 in cut_points(empty, interval=2)  # an empty question joins nothing to the header
    assert cut_points([*layout[:7], PromptSegment(K.HEADER, "h", ())])[-1] == 21  # nor does an empty header
    assert 21 + JOIN_TOKENS not in cut_points([*long[:7], replace(long[7], token_ids=tuple(range(JOIN_TOKENS))),
                                                long[8]])
    shared = [PromptSegment(K.SYSTEM, "s", (1, 2, 3), protected=True), PromptSegment(K.FILE, "a", (4, 5, 6))]
    assert cut_points(shared, interval=2) == [2, 3, 5, 6]  # a protected segment's end is an anchor too
    assert [b.protected for b in boundaries("p", shared)] == [True, False]


def test_window_dense_run_ends_at_the_first_dense_or_unstable_kind():
    policy = WindowPolicy(dense_tail=0)
    files = [PromptSegment(K.SYSTEM, "s", (1,) * 10), PromptSegment(K.FILE, "a", (1,) * 20)]
    for tail in (K.HOT, K.TURN, K.QUESTION, K.HEADER, K.ANSWER, K.PROMPT):
        assert policy.dense_from([*files, PromptSegment(tail, "t", (1,) * 5), *files]) == 30, tail
    assert policy.dense_from([*files, PromptSegment(K.MAP, "m", (1,) * 5)]) == 35


def test_archive_rows_name_a_kind():
    row = {"key": "0123456789abcdef", "token_key": "t", "parent": "", "start": 0, "end": 2,
           "tokens": b"\0" * 8, "kind": "hot", "protected": False, "size": 4, "checksum": "0", "last_used": 1.0}
    assert ArchiveEntry.parse(row["key"], row).boundary().kind is K.HOT
    assert ArchiveEntry.parse(row["key"], {**row, "kind": "chapter"}) is None
    assert ArchiveEntry.parse(row["key"], {**row, "kind": ["hot"]}) is None


@pytest.fixture
def workspace(tmp_path, tiny_loaded):
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    ws = Workspace(tmp_path, tiny_loaded.tokenizer, persist=False, hot_share=0.5)
    ws.build()
    return ws


def test_context_segments_go_into_the_engine_as_they_are(tiny_loaded, workspace):
    turns = [("user", "Hi"), ("assistant", "Hello.")]
    segments = workspace.prompt("What does tokens do?", turns)
    assert {type(s.kind) for s in segments} == {SegmentKind}
    assert [s.kind for s in segments[-5:]] == [K.TURN, K.HEADER, K.ANSWER, K.QUESTION, K.HEADER]
    converted = [PromptSegment(s.kind, s.key, tuple(s.token_ids), s.protected) for s in segments]
    assert boundaries("p", segments, 16) == boundaries("p", converted, 16)
    ends = [sum(len(s) for s in segments[:i + 1]) for i in range(len(segments))]
    follow_up = workspace.prompt("And split?", turns)
    with Engine(tiny_loaded, prefill_chunk=16) as engine:
        request = Request(segments=segments, max_tokens=6)
        events = list(engine.submit(request))
        assert request.segments is segments and events[-1].finish_reason in ("stop", "length")
        kinds = {c["end"]: c["kind"] for c in engine.stats()["cache"]["checkpoint_list"]}
        # The turn and the question are prefilled with the header after them: no checkpoint at their ends.
        assert [kinds.get(end) for end in ends[-5:]] == [None, "header", "answer", None, "header"]
        _, warm = run(engine, follow_up, max_tokens=6)
    assert warm.metrics.cached_tokens == ends[-3]  # everything before the new question was restored


def test_engine_request_does_not_import_mlx():
    code = ("import sys, engine.request, context.segments; "
            "assert not any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules), 'mlx imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
