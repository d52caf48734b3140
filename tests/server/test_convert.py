"""Position encodings and document sync without a transport."""
from __future__ import annotations

import pytest
from lsprotocol import types

from server.lsp import convert
from server.lsp.convert import UTF8, UTF16, UTF32, Span
from server.lsp.documents import DocumentStore
from server.lsp.errors import InvalidPositionError

TEXT = "x = 'é😀z'\r\nb\rc\nlast"
#        0123 4 5 6 7 8 ...


@pytest.mark.parametrize("encoding,emoji_start,z_col", [(UTF8, 7, 11), (UTF16, 6, 8), (UTF32, 6, 7)])
def test_columns_count_in_the_negotiated_unit(encoding, emoji_start, z_col):
    emoji = TEXT.index("😀")
    assert convert.to_position(TEXT, emoji, encoding) == types.Position(0, emoji_start)
    assert convert.to_position(TEXT, TEXT.index("z"), encoding) == types.Position(0, z_col)
    assert convert.to_offset(TEXT, types.Position(0, z_col), encoding) == TEXT.index("z")


@pytest.mark.parametrize("encoding", [UTF8, UTF16, UTF32])
def test_every_offset_round_trips(encoding):
    for offset, ch in enumerate(TEXT):
        if ch == "\n" and TEXT[offset - 1] == "\r":
            continue  # inside a CRLF terminator there is no position
        position = convert.to_position(TEXT, offset, encoding)
        assert convert.to_offset(TEXT, position, encoding) == offset


def test_lines_end_at_cr_crlf_and_lf_only():
    assert convert.to_position(TEXT, TEXT.index("b"), UTF16) == types.Position(1, 0)
    assert convert.to_position(TEXT, TEXT.index("c"), UTF16) == types.Position(2, 0)
    assert convert.to_position(TEXT, TEXT.index("last"), UTF16) == types.Position(3, 0)
    assert convert.to_position("a\u2028b", 2, UTF16) == types.Position(0, 2)  # not a line end in LSP


def test_positions_past_the_end_clamp():
    assert convert.to_offset(TEXT, types.Position(0, 999), UTF16) == TEXT.index("\r")
    assert convert.to_offset(TEXT, types.Position(4, 7), UTF16) == len(TEXT)  # the line after the last


def test_a_line_more_than_one_past_the_end_is_rejected():
    with pytest.raises(InvalidPositionError, match="line 5 is past the end of the document \\(4 lines\\)"):
        convert.to_offset(TEXT, types.Position(5, 0), UTF16)


def test_a_reversed_range_is_rejected():
    with pytest.raises(InvalidPositionError, match=r"the range ends \(0:1\) before it starts \(0:3\)"):
        convert.to_span(TEXT, types.Range(types.Position(0, 3), types.Position(0, 1)), UTF16)


def test_range_round_trip_covers_the_emoji():
    span = Span(TEXT.index("😀"), TEXT.index("z"))
    rng = convert.to_range(TEXT, span, UTF16)
    assert (rng.start.character, rng.end.character) == (6, 8)
    assert convert.to_span(TEXT, rng, UTF16) == span


def test_choose_encoding_prefers_client_order():
    def caps(encodings):
        return types.ClientCapabilities(general=types.GeneralClientCapabilities(position_encodings=encodings))
    assert convert.choose_encoding(caps(["utf-8", "utf-16"])) == UTF8
    assert convert.choose_encoding(caps(["utf-32"])) == UTF32
    assert convert.choose_encoding(caps(["latin-1"])) == UTF16
    assert convert.choose_encoding(types.ClientCapabilities()) == UTF16


@pytest.mark.parametrize("encoding", [UTF8, UTF16, UTF32])
def test_incremental_changes_after_non_ascii(encoding):
    store = DocumentStore(encoding)
    store.open(types.TextDocumentItem(uri="file:///t.py", language_id="python", version=1, text="ä😀b\nzz\n"))
    start = convert.to_position("ä😀b\nzz\n", 2, encoding)  # before "b"
    change = types.TextDocumentContentChangePartial(
        range=types.Range(start=start, end=types.Position(start.line, start.character + 1)), text="Ω")
    whole = types.TextDocumentContentChangeWholeDocument(text="reset ü\n")
    second = types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(0, convert.unit_length("reset ü", encoding)),
                          end=types.Position(1, 0)), text="!\n")
    doc = store.change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri="file:///t.py", version=2), content_changes=[change]))
    assert doc.text == "ä😀Ω\nzz\n" and doc.version == 2
    doc = store.change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri="file:///t.py", version=3),
        content_changes=[whole, second]))
    assert doc.text == "reset ü!\n"


def test_workspace_edit_creates_then_edits():
    edit = convert.workspace_edit("file:///t/test_x.py", [types.TextEdit(
        range=types.Range(types.Position(0, 0), types.Position(0, 0)), new_text="x")], create=True)
    assert isinstance(edit.document_changes[0], types.CreateFile)
    assert edit.document_changes[1].edits[0].new_text == "x"


def test_range_json_round_trip_and_rejects_garbage():
    rng = types.Range(start=types.Position(1, 2), end=types.Position(3, 4))
    assert convert.range_from_json(convert.range_to_json(rng)) == rng
    with pytest.raises(Exception):
        convert.range_from_json({"start": {"line": "x"}})


@pytest.mark.parametrize("uri, expected", [
    ("file:///tmp/a.py", "/tmp/a.py"), ("file:///tmp/a%281%29%2Bb.py", "/tmp/a(1)+b.py"),
    ("file:///tmp/a(1)+b.py", "/tmp/a(1)+b.py"),
    ("file:relative.py", None),  # read against the workspace root it would name another file
    ("file:///C:/proj/a.py", None),  # a Windows drive: not an absolute path on this host
    ("untitled:Untitled-1", None), ("https://example.org/a.py", None),
])
def test_only_file_uris_with_an_absolute_path_name_a_file(uri, expected):
    found = convert.file_path(uri)
    assert (None if found is None else str(found)) == expected
    doc = DocumentStore(UTF16).open(types.TextDocumentItem(uri=uri, language_id="python", version=1, text="x"))
    assert doc.path == found  # an open buffer knows its file the same way
