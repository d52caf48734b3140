"""The note after a hot copy: which copy is current, the changed lines as they read now, and
its place in the budget (the share bounds the copies, the budget counts everything)."""
from __future__ import annotations

from context.hot import CHANGED_LINES_SHOWN, superseded_note
from context.workspace import Workspace


def test_note_shows_the_new_lines_only():
    built = "def old_name(x):\n    return x * 2\n\n\nLIMIT = 3\n"
    current = "def new_name(x):\n    return x * 2\n\n\nLIMIT = 4\n"
    note = superseded_note("pkg/util.py", built, current)
    assert note.startswith('<note path="pkg/util.py">The file above is the current pkg/util.py; '
                           "its copy earlier in this prompt is out of date.")
    assert "def new_name(x):\nLIMIT = 4\n</note>\n" in note
    assert "old_name" not in note and "LIMIT = 3" not in note  # the stale text is never repeated


def test_note_is_bounded_and_says_when_lines_were_only_removed():
    built = "a = 1\n"
    current = "".join(f"v{i} = {i}\n" for i in range(20))
    note = superseded_note("m.py", built, current)
    assert note.count("\n") == 1 + CHANGED_LINES_SHOWN + 1 + 1  # wording, lines, "(N more)", closing tag
    assert f"({20 - CHANGED_LINES_SHOWN} more)" in note
    assert "Lines were removed." in superseded_note("m.py", "a = 1\nb = 2\n", "a = 1\n")
    assert "<\u200b|im_end|>" in superseded_note("m.py", "a = 1\n", "s = '<|im_end|>'\n")  # neutralized


def test_hot_segment_ends_with_the_note_and_leaves_with_the_edit(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    before = ws.build().segments
    built = (repo / "pkg/util.py").read_text()
    edited = built.replace("x * 2", "x * 5")
    _, layout = ws.update("pkg/util.py", edited)
    tail = layout.segments[-1]
    assert tail.text.endswith('<note path="pkg/util.py">The file above is the current pkg/util.py; its copy '
                              "earlier in this prompt is out of date. Changed lines, as they read now:\n"
                              "return x * 5\n</note>\n")
    assert list(tail.token_ids) == smol_tokenizer.encode(tail.text)  # one text, tokenized as a whole
    _, new_file = ws.update("pkg/new.py", "NEW = 1\n")
    assert "<note" not in new_file.segments[-1].text  # no copy in place: nothing is out of date
    ws.update("pkg/new.py", None)
    _, undone = ws.update("pkg/util.py", built)
    assert [s.text for s in undone.segments] == [s.text for s in before]


def _edit_app(ws):
    text = (ws.root / "app.py").read_text() + "# edited\n"
    return ws.update("app.py", text)[1].segments[-1]


def test_share_bounds_the_copies_and_the_budget_counts_the_notes(repo, smol_tokenizer):
    probe = Workspace(repo, smol_tokenizer, persist=False)
    stable = probe.build().tokens
    tail = _edit_app(probe)
    copy = len(smol_tokenizer.encode(tail.text[:tail.text.index("<note")]))
    share = (copy + len(tail)) / 2 / stable  # the copy fits it, copy + note would not
    ws = Workspace(repo, smol_tokenizer, persist=False, hot_share=share)
    ws.build()
    tail = _edit_app(ws)
    assert copy <= share * stable < len(tail)
    assert (tail.kind, tail.key) == ("hot", "app.py")  # still hot: the note does not fold the tail
    assert ws.layout.tokens == stable + len(tail)  # the budget counts the note
    folded = Workspace(repo, smol_tokenizer, persist=False, hot_share=copy / 2 / stable)
    folded.build()
    assert _edit_app(folded).kind == "file"  # a copy over the share folds, as before
