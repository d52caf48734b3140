"""Document sync handlers: open buffers, edits and file events reach the session host.

They work in both phases: buffers are kept from the first `didOpen`, and what
changes while the model loads is read by the workspace prompt once it is built.
"""
from __future__ import annotations

from typing import Any

from lsprotocol import types

from . import convert


def register(server: Any) -> None:
    """Registers document sync on `server` (a `CodectxServer`)."""

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls, params: types.DidOpenTextDocumentParams) -> None:
        doc = ls.base.documents.open(params.text_document)
        ls.host.reread(doc.path)
        ls.host.focus(doc.path, 1)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls, params: types.DidChangeTextDocumentParams) -> None:
        doc = ls.base.documents.change(params)
        ls.host.changed([convert.file_path(doc.uri)])
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=doc.uri, diagnostics=[]))
        changes = params.content_changes
        line = changes[-1].range.start.line + 1 if changes and hasattr(changes[-1], "range") else 1
        ls.host.focus(doc.path, line)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls, params: types.DidCloseTextDocumentParams) -> None:
        if ls.base.documents.close(params.text_document.uri) is not None:
            ls.host.reread(convert.file_path(params.text_document.uri))

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched(ls, params: types.DidChangeWatchedFilesParams) -> None:
        ls.host.changed([convert.file_path(change.uri) for change in params.changes])
