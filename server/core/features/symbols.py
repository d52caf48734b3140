"""Identifiers under the cursor and where they are defined: the server's names for
`context.definitions`, the one definition index (context owns it; the focus, hover and code
actions read the same tree-sitter tags)."""
from __future__ import annotations

from context.definitions import (MAX_SNIPPET_LINES, DefinitionIndex, DefinitionSite, ReferenceCount,
                                 definitions_in, enclosing_definition, references_in, site_of)
from context.definitions import identifier_at as _identifier_at

from ..span import Span

__all__ = ["MAX_SNIPPET_LINES", "DefinitionIndex", "DefinitionSite", "ReferenceCount", "definitions_in",
           "enclosing_definition", "identifier_at", "references_in", "site_of"]


def identifier_at(text: str, offset: int) -> tuple[str, Span] | None:
    """The identifier touching `offset`, with its span."""
    found = _identifier_at(text, offset)
    return (found[0], Span(*found[1])) if found is not None else None
