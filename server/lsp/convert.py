"""Every conversion between codectx values and lsprotocol types.

Documents are held as Python strings (code points). LSP positions count
`character` in the negotiated position encoding: UTF-16 code units (the
default, VS Code), UTF-8 bytes (Neovim may ask) or UTF-32 code points (Emacs).
Lines end at "\\n", "\\r\\n" or "\\r" and nowhere else.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from lsprotocol import types
from pygls.protocol import default_converter
from pygls.uris import to_fs_path

from server.core.span import Span

from .errors import InvalidPositionError
from .messages import register_strict_primitives

UTF8 = types.PositionEncodingKind.Utf8
UTF16 = types.PositionEncodingKind.Utf16
UTF32 = types.PositionEncodingKind.Utf32
SUPPORTED_ENCODINGS = (UTF8, UTF16, UTF32)

LINE_END = re.compile(r"\r\n|\r|\n")
# Characters str.splitlines() also breaks at, though LSP does not.
_OTHER_BREAKS = re.compile("[\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")  # two UTF-16 code units each
_JSON = default_converter()
register_strict_primitives(_JSON)  # command arguments come from the client too


def file_path(uri: str) -> Path | None:
    """The absolute path a `file:` URI names; None for another scheme (`untitled:`) or for a file URI whose
    path is not absolute here (`file:relative.py`, a Windows drive's `file:///C:/a.py` on a POSIX host):
    read against the workspace root, such a path would name another file."""
    path = to_fs_path(uri)
    return Path(path) if path and os.path.isabs(path) else None


def choose_encoding(capabilities: types.ClientCapabilities) -> types.PositionEncodingKind:
    """Picks the client's most preferred encoding that we support; UTF-16 otherwise."""
    general = capabilities.general
    for name in (general.position_encodings or []) if general else []:
        for kind in SUPPORTED_ENCODINGS:
            if name == kind.value:
                return kind
    return UTF16


def unit_length(text: str, encoding: types.PositionEncodingKind) -> int:
    """Length of `text` in the units of `encoding` (a lone surrogate counts as one code unit)."""
    if encoding == UTF32 or text.isascii():
        return len(text)
    if encoding == UTF8:
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def column_to_index(line: str, units: int, encoding: types.PositionEncodingKind) -> int:
    """Code-point index of column `units` in `line` (no terminator).

    Past the end clamps to the end; a column inside a character rounds up to the
    character's end. Costs O(len(line)) in C, whatever the encoding.
    """
    if encoding == UTF32 or line.isascii():
        return min(units, len(line))
    if encoding == UTF8:
        data = line.encode("utf-8", "surrogatepass")
        if units >= len(data):
            return len(line)
        while units < len(data) and data[units] & 0xC0 == 0x80:  # a continuation byte
            units += 1
        return len(data[:units].decode("utf-8", "surrogatepass"))
    # UTF-16: index i is at column i + (astral characters before i).
    for before, match in enumerate(_ASTRAL.finditer(line)):
        at = match.start()
        if units <= at + before:
            return units - before
        if units <= at + before + 2:
            return at + 1
    return min(units - len(_ASTRAL.findall(line)), len(line))


def split_lines(text: str) -> list[str]:
    """`text` as lines, each with its terminator; the last has none (and may be "")."""
    if not _OTHER_BREAKS.search(text):
        lines = text.splitlines(keepends=True)
        if not lines or lines[-1][-1] in "\r\n":
            lines.append("")
        return lines
    parts = LINE_END.split(text)
    ends = LINE_END.findall(text)
    return [part + end for part, end in zip(parts, ends)] + [parts[-1]]


def _line_at(text: str, line: int) -> tuple[int, int]:
    """(start, end-without-terminator) of 0-based `line`, scanning only up to it.

    Raises:
        InvalidPositionError: `line` is more than one past the last line.
    """
    start, count = 0, 0
    for match in LINE_END.finditer(text):
        if count == line:
            return start, match.start()
        start, count = match.end(), count + 1
    if count == line:
        return start, len(text)
    if count + 1 == line:
        return len(text), len(text)
    raise InvalidPositionError(f"line {line} is past the end of the document ({count + 1} lines)")


def to_offset(text: str, position: types.Position, encoding: types.PositionEncodingKind) -> int:
    """Code-point offset of an LSP position.

    A character past its line's end is the line's end; the line just past the last
    one is the end of the document (both as LSP says).

    Raises:
        InvalidPositionError: A line more than one past the last.
    """
    start, end = _line_at(text, position.line)
    return start + column_to_index(text[start:end], position.character, encoding)


def to_position(text: str, offset: int, encoding: types.PositionEncodingKind) -> types.Position:
    """LSP position of a code-point offset into `text`."""
    offset = max(0, min(offset, len(text)))
    line, start = 0, 0
    for match in LINE_END.finditer(text, 0, offset):
        line, start = line + 1, match.end()
    end = LINE_END.search(text, start)
    stop = min(offset, end.start() if end else len(text))
    return types.Position(line=line, character=unit_length(text[start:max(start, stop)], encoding))


def to_span(text: str, rng: types.Range, encoding: types.PositionEncodingKind) -> Span:
    """Code-point span of an LSP range.

    Raises:
        InvalidPositionError: The range ends before it starts, or a line more than one
            past the last.
    """
    check_order(rng)
    return Span(to_offset(text, rng.start, encoding), to_offset(text, rng.end, encoding))


def check_order(rng: types.Range) -> None:
    """Raises InvalidPositionError if `rng` ends before it starts."""
    start, end = rng.start, rng.end
    if (end.line, end.character) < (start.line, start.character):
        raise InvalidPositionError(f"the range ends ({end.line}:{end.character}) before it starts "
                                   f"({start.line}:{start.character})")


def to_range(text: str, span: Span, encoding: types.PositionEncodingKind) -> types.Range:
    """LSP range of a code-point span."""
    return types.Range(start=to_position(text, span.start, encoding), end=to_position(text, span.end, encoding))


def markdown_hover(markdown: str, text: str, span: Span, encoding) -> types.Hover:
    """A hover with markdown contents over `span`."""
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=markdown),
        range=to_range(text, span, encoding),
    )


def text_edit(text: str, span: Span, new_text: str, encoding) -> types.TextEdit:
    """A TextEdit replacing `span` of `text`."""
    return types.TextEdit(range=to_range(text, span, encoding), new_text=new_text)


def workspace_edit(uri: str, edits: list[types.TextEdit], version: int | None = None,
                   create: bool = False) -> types.WorkspaceEdit:
    """A WorkspaceEdit on one document, optionally creating it first."""
    document = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version)
    changes: list = [types.TextDocumentEdit(text_document=document, edits=edits)]
    if create:
        changes.insert(0, types.CreateFile(uri=uri, options=types.CreateFileOptions(ignore_if_exists=True)))
    return types.WorkspaceEdit(document_changes=changes)


def diagnostic(text: str, span: Span, message: str, encoding) -> types.Diagnostic:
    """A warning diagnostic with source "codectx"."""
    return types.Diagnostic(range=to_range(text, span, encoding), message=message,
                            severity=types.DiagnosticSeverity.Warning, source="codectx")


def position_at(text: str, line: int, column: int, encoding) -> types.Position:
    """LSP position of 0-based `line` and code-point `column` in `text`."""
    lines = LINE_END.split(text)
    prefix = lines[line][:column] if line < len(lines) else ""
    return types.Position(line=line, character=unit_length(prefix, encoding))


def insertion_edit(uri: str, text: str, line: int, column: int, new_text: str, encoding,
                   version: int | None = None, create: bool = False) -> types.WorkspaceEdit:
    """A WorkspaceEdit inserting `new_text` at (line, code-point column) of `text`."""
    at = position_at(text, line, column, encoding)
    edit = types.TextEdit(range=types.Range(start=at, end=at), new_text=new_text)
    return workspace_edit(uri, [edit], version, create)


def code_action(title: str, data: dict, kind: str) -> types.CodeAction:
    """An unresolved code action (edit/command come from `codeAction/resolve`)."""
    return types.CodeAction(title=title, kind=kind, data=data)


def range_from_json(data: object) -> types.Range:
    """A Range from command arguments or code-action data (raises on a malformed value)."""
    return _JSON.structure(data, types.Range)


def range_to_json(rng: types.Range) -> dict:
    """A Range as JSON-ready data (for code-action `data`)."""
    return _JSON.unstructure(rng)
