"""Open editor buffers, kept in sync incrementally.

The unsaved text of an open buffer is what the model sees; closed files come
from disk through the context layer. A `didChange` applies all of its changes
or none: a change that cannot apply (a range that ends before it starts, a line
more than one past the end) leaves the buffer and its version as they were.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

from lsprotocol import types

from . import convert
from .buffer import LineBuffer
from .errors import DocumentNotOpenError, EditRejectedError, InvalidPositionError


class Document:
    """One open buffer.

    Args:
        uri: The document's URI.
        text: Its text when opened.
        version: The client's version number.
        language_id: The client's language id.
    """

    def __init__(self, uri: str, text: str, version: int, language_id: str = "") -> None:
        self.uri = uri
        self.version = version
        self.language_id = language_id
        self.buffer = LineBuffer(text)

    @property
    def text(self) -> str:
        """The current text (joined lazily after edits, then cached)."""
        return self.buffer.text

    @cached_property
    def path(self) -> Path | None:
        """The file system path, or None for non-file URIs."""
        return convert.file_path(self.uri)

    def apply(self, changes: Sequence[types.TextDocumentContentChangeEvent],
              encoding: types.PositionEncodingKind) -> None:
        """Applies `changes` in order, all or none.

        Raises:
            EditRejectedError: One change could not apply; the buffer is unchanged.
        """
        with self.buffer.lock:  # one edit, whole, for a reader on another thread
            self._apply(changes, encoding)

    def _apply(self, changes: Sequence[types.TextDocumentContentChangeEvent],
               encoding: types.PositionEncodingKind) -> None:
        before, steps = self.buffer.cached_text, []
        try:
            for index, change in enumerate(changes):
                if isinstance(change, types.TextDocumentContentChangePartial):
                    steps.append(self.buffer.replace(change.range, change.text, encoding))
                else:
                    steps.append(self.buffer.replace_all(change.text))
        except InvalidPositionError as err:
            self.buffer.undo(steps, before)
            where = f"change {index + 1} of {len(changes)}" if len(changes) > 1 else "the change"
            raise EditRejectedError(f"edit of {self.uri} (version {self.version} kept) rejected, "
                                    f"{where}: {err}") from err
        except BaseException:
            self.buffer.undo(steps, before)
            raise


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
        """Applies the changes in order (all or none) and returns the updated document.

        Raises:
            DocumentNotOpenError: The document is not open.
            EditRejectedError: A change could not apply; the document and its version
                are unchanged.
        """
        uri = params.text_document.uri
        doc = self._docs.get(uri)
        if doc is None:
            raise DocumentNotOpenError(f"didChange for {uri}, which is not open")
        doc.apply(params.content_changes, self.encoding)
        doc.version = params.text_document.version
        return doc

    def close(self, uri: str) -> Document | None:
        return self._docs.pop(uri, None)

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def by_path(self, path: Path) -> Document | None:
        """The open buffer for a file system path, if any."""
        return next((d for d in list(self._docs.values()) if d.path == path), None)  # (copied: read off the loop too)

    def __len__(self) -> int:
        return len(self._docs)
