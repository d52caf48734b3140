"""Open editor buffers, kept in sync incrementally.

The unsaved text of an open buffer is what the model sees; closed files come
from disk through the context layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lsprotocol import types
from pygls.uris import to_fs_path

from .convert import apply_change


@dataclass
class Document:
    """One open buffer."""

    uri: str
    text: str
    version: int
    language_id: str = ""

    @property
    def path(self) -> Path | None:
        """The file system path, or None for non-file URIs."""
        fs_path = to_fs_path(self.uri)
        return Path(fs_path) if fs_path else None


class DocumentStore:
    """Open documents by URI.

    Args:
        encoding: The negotiated position encoding for incremental changes.
    """

    def __init__(self, encoding: types.PositionEncodingKind) -> None:
        self.encoding = encoding
        self._docs: dict[str, Document] = {}

    def open(self, item: types.TextDocumentItem) -> Document:
        doc = Document(item.uri, item.text, item.version, item.language_id)
        self._docs[item.uri] = doc
        return doc

    def change(self, params: types.DidChangeTextDocumentParams) -> Document:
        """Applies the changes in order and returns the updated document.

        Raises:
            KeyError: The document is not open.
        """
        doc = self._docs[params.text_document.uri]
        for change in params.content_changes:
            doc.text = apply_change(doc.text, change, self.encoding)
        doc.version = params.text_document.version
        return doc

    def close(self, uri: str) -> Document | None:
        return self._docs.pop(uri, None)

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def text(self, uri: str) -> str:
        """The buffer text, or the file on disk when the buffer is not open.

        Raises:
            KeyError: Neither an open buffer nor a readable file.
        """
        if (doc := self._docs.get(uri)) is not None:
            return doc.text
        fs_path = to_fs_path(uri)
        try:
            return Path(fs_path).read_text(encoding="utf-8", errors="replace")
        except (OSError, TypeError) as err:
            raise KeyError(uri) from err

    def by_path(self, path: Path) -> Document | None:
        """The open buffer for a file system path, if any."""
        return next((d for d in self._docs.values() if d.path == path), None)

    def __len__(self) -> int:
        return len(self._docs)
