"""Every conversion between codectx values and lsprotocol types.

Documents are held as Python strings (code points). LSP positions count
`character` in the negotiated position encoding: UTF-16 code units (the
default, VS Code), UTF-8 bytes (Neovim may ask) or UTF-32 code points (Emacs).
Lines end at "\\n", "\\r\\n" or "\\r" and nowhere else.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from lsprotocol import types
from pygls.protocol import default_converter

UTF8 = types.PositionEncodingKind.Utf8
UTF16 = types.PositionEncodingKind.Utf16
UTF32 = types.PositionEncodingKind.Utf32
SUPPORTED_ENCODINGS = (UTF8, UTF16, UTF32)

_LINE_END = re.compile(r"\r\n|\r|\n")
_JSON = default_converter()


def choose_encoding(capabilities: types.ClientCapabilities) -> types.PositionEncodingKind:
    """Picks the client's most preferred encoding that we support; UTF-16 otherwise."""
    general = capabilities.general
    for name in (general.position_encodings or []) if general else []:
        for kind in SUPPORTED_ENCODINGS:
            if name == kind.value:
                return kind
    return UTF16


def unit_length(text: str, encoding: types.PositionEncodingKind) -> int:
    """Length of `text` in the units of `encoding`."""
    if encoding == UTF32:
        return len(text)
    if encoding == UTF8:
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def _line_bounds(text: str) -> list[tuple[int, int]]:
    """(start, end-without-terminator) offsets of every line."""
    bounds, start = [], 0
    for match in _LINE_END.finditer(text):
        bounds.append((start, match.start()))
        start = match.end()
    bounds.append((start, len(text)))
    return bounds


def _column_to_index(line: str, units: int, encoding: types.PositionEncodingKind) -> int:
    if encoding == UTF32:
        return min(units, len(line))
    seen = 0
    for index, ch in enumerate(line):
        if seen >= units:
            return index
        seen += unit_length(ch, encoding)
    return len(line)


def to_offset(text: str, position: types.Position, encoding: types.PositionEncodingKind) -> int:
    """Code-point offset of an LSP position; past-the-end values clamp to the end."""
    bounds = _line_bounds(text)
    if position.line >= len(bounds):
        return len(text)
    start, end = bounds[position.line]
    return start + _column_to_index(text[start:end], position.character, encoding)


def to_position(text: str, offset: int, encoding: types.PositionEncodingKind) -> types.Position:
    """LSP position of a code-point offset into `text`."""
    offset = max(0, min(offset, len(text)))
    bounds = _line_bounds(text)
    line = next(i for i, (_, end) in enumerate(bounds) if offset <= end)
    start, end = bounds[line]
    return types.Position(line=line, character=unit_length(text[start:min(offset, end)], encoding))


@dataclass(frozen=True)
class Span:
    """A half-open code-point range [start, end) in one document."""

    start: int
    end: int


def to_span(text: str, rng: types.Range, encoding: types.PositionEncodingKind) -> Span:
    """Code-point span of an LSP range."""
    return Span(to_offset(text, rng.start, encoding), to_offset(text, rng.end, encoding))


def to_range(text: str, span: Span, encoding: types.PositionEncodingKind) -> types.Range:
    """LSP range of a code-point span."""
    return types.Range(start=to_position(text, span.start, encoding), end=to_position(text, span.end, encoding))


def apply_change(text: str, change: types.TextDocumentContentChangeEvent,
                 encoding: types.PositionEncodingKind) -> str:
    """Applies one `didChange` content change (incremental or whole)."""
    if isinstance(change, types.TextDocumentContentChangePartial):
        span = to_span(text, change.range, encoding)
        return text[: span.start] + change.text + text[span.end:]
    return change.text


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
    lines = _LINE_END.split(text)
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
