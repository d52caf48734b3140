"""The line-based document buffer against a naive reference, over thousands of random edits.

The reference keeps one flat string and converts positions the slow, obvious way
(split every line, walk every character). Edits are seeded random: non-ASCII text
(accents, emoji outside the BMP, combining marks, CJK), LF/CRLF/CR line ends,
inserts that join a "\\r" with a following "\\n", positions past a line's end and
inside a multi-unit character, the line just past the last; some didChange batches
hold an impossible change after valid ones, which must leave buffer and version as
they were.
"""
from __future__ import annotations

import random
import re

import pytest
from lsprotocol import types

from server.lsp import convert
from server.lsp.convert import UTF8, UTF16, UTF32
from server.lsp.documents import DocumentStore
from server.lsp.errors import EditRejectedError

URI = "file:///buffer.py"
PIECES = ["a", "bc", "def ", "é", "😀", "e\u0301", "中文", " ", "\t", "\n", "\r\n", "\r", "x\r", "\ny", "🙂z"]
CODEC = {UTF8: ("utf-8", 1), UTF16: ("utf-16-le", 2), UTF32: ("utf-32-le", 4)}


class Impossible(Exception):
    """The reference's rejection."""


def ref_lines(text: str) -> list[tuple[int, int]]:
    """(start, end without terminator) of every line, by a regex over the whole text."""
    bounds, start = [], 0
    for match in re.finditer(r"\r\n|\r|\n", text):
        bounds.append((start, match.start()))
        start = match.end()
    return bounds + [(start, len(text))]


def ref_offset(text: str, line: int, character: int, encoding) -> int:
    bounds = ref_lines(text)
    if line == len(bounds):
        return len(text)
    if line > len(bounds):
        raise Impossible
    start, end = bounds[line]
    codec, width = CODEC[encoding]
    units = 0
    for index in range(start, end):
        if units >= character:
            return index
        units += len(text[index].encode(codec)) // width
    return end


def ref_apply(text: str, changes: list, encoding) -> str:
    for change in changes:
        if isinstance(change, types.TextDocumentContentChangeWholeDocument):
            text = change.text
            continue
        start, end = change.range.start, change.range.end
        if (end.line, end.character) < (start.line, start.character):
            raise Impossible
        a = ref_offset(text, start.line, start.character, encoding)
        b = ref_offset(text, end.line, end.character, encoding)
        text = text[:a] + change.text + text[b:]
    return text


def random_text(rng: random.Random, pieces: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(pieces))


def random_position(rng: random.Random, text: str, encoding) -> types.Position:
    bounds = ref_lines(text)
    line = rng.randrange(len(bounds) + 1)  # one past the last is allowed
    if line == len(bounds):
        return types.Position(line, rng.randrange(4))
    start, end = bounds[line]
    width = convert.unit_length(text[start:end], encoding)
    return types.Position(line, rng.randrange(width + 3))  # past the end clamps; mid-character rounds


def random_change(rng: random.Random, text: str, encoding) -> object:
    """Mostly small edits near one place (as typing makes), some wide or impossible ones."""
    roll = rng.random()
    if roll < 0.01:
        return types.TextDocumentContentChangeWholeDocument(text=random_text(rng, 200))
    a = random_position(rng, text, encoding)
    if roll < 0.03:
        b = types.Position(a.line + rng.randrange(3, 10), rng.randrange(6))  # a wider range
    elif roll < 0.25:
        b = types.Position(a.line + rng.randrange(1, 3), rng.randrange(6))  # across line ends
    else:
        b = types.Position(a.line, a.character + rng.randrange(4))
    if (b.line, b.character) < (a.line, a.character):
        a, b = b, a
    if roll > 0.96 and (a.line, a.character) != (b.line, b.character):
        a, b = b, a  # reversed: impossible
    elif roll > 0.93:
        b = types.Position(len(ref_lines(text)) + 1 + rng.randrange(50), 0)  # far past the end: impossible
    new_text = random_text(rng, rng.randrange(6)) if rng.random() < 0.85 else ""
    return types.TextDocumentContentChangePartial(range=types.Range(start=a, end=b), text=new_text)


@pytest.mark.parametrize("encoding", [UTF8, UTF16, UTF32])
def test_incremental_buffer_equals_the_reference(encoding):
    rng = random.Random(f"codectx-buffer-{encoding.value}")
    text = random_text(rng, 300)
    store = DocumentStore(encoding)
    store.open(types.TextDocumentItem(uri=URI, language_id="python", version=1, text=text))
    version, rejected, sizes = 1, 0, []
    for step in range(2500):
        changes = [random_change(rng, text, encoding) for _ in range(1 if rng.random() < 0.8 else 3)]
        params = types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=version + 1),
            content_changes=changes)
        try:
            expected = ref_apply(text, changes, encoding)
        except Impossible:
            with pytest.raises(EditRejectedError):
                store.change(params)
            rejected, compare = rejected + 1, True
        else:
            store.change(params)
            text, version = expected, version + 1
            compare = step % 7 == 0  # in between, edits pile up on a buffer that is not joined
        doc = store.get(URI)
        if compare:
            assert doc.text == text, f"step {step}"
        sizes.append(len(text))
        assert doc.version == version
        assert doc.buffer.line_count == len(ref_lines(text))
    assert store.get(URI).text == text
    assert rejected > 100 and version > 1500  # both paths were really exercised
    assert min(sizes[100:]) > 200  # on a text that stayed large


@pytest.mark.parametrize("encoding", [UTF8, UTF16, UTF32])
def test_string_conversions_equal_the_reference(encoding):
    rng = random.Random(f"codectx-convert-{encoding.value}")
    for _ in range(300):
        text = random_text(rng, 30)
        position = random_position(rng, text, encoding)
        offset = convert.to_offset(text, position, encoding)
        assert offset == ref_offset(text, position.line, position.character, encoding)
        back = convert.to_position(text, offset, encoding)
        assert convert.to_offset(text, back, encoding) == offset


def test_a_rejected_batch_leaves_the_cached_text_and_version():
    store = DocumentStore(UTF16)
    store.open(types.TextDocumentItem(uri=URI, language_id="python", version=3, text="ab\r\ncd"))
    good = types.TextDocumentContentChangePartial(
        range=types.Range(types.Position(0, 2), types.Position(1, 0)), text="\n\n")
    reversed_range = types.TextDocumentContentChangePartial(
        range=types.Range(types.Position(0, 2), types.Position(0, 1)), text="x")
    with pytest.raises(EditRejectedError, match=r"change 2 of 2: the range ends \(0:1\) before it starts \(0:2\)"):
        store.change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=4),
            content_changes=[good, reversed_range]))
    doc = store.get(URI)
    assert (doc.text, doc.version, doc.buffer.line_count) == ("ab\r\ncd", 3, 2)


def test_a_cr_and_a_following_lf_become_one_line_end():
    store = DocumentStore(UTF16)
    store.open(types.TextDocumentItem(uri=URI, language_id="python", version=1, text="a\rb\nc"))
    delete_b = types.TextDocumentContentChangePartial(
        range=types.Range(types.Position(1, 0), types.Position(1, 1)), text="")
    doc = store.change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2), content_changes=[delete_b]))
    assert doc.text == "a\r\nc" and doc.buffer.line_count == 2 and doc.buffer.line(1) == "c"
