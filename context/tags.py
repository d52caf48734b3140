"""Definitions, references and imports of a file, from tree-sitter tag queries (queries/*.scm).

Unknown languages and files that fail to parse give empty tags, never an exception.
Results are cached by (language, content hash) and persisted with msgpack.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import xxhash
from tree_sitter import Parser, Query, QueryCursor, QueryError

from context import store
from context.errors import QueryFileError
from context.home import codectx_home
from context.languages import grammar

log = logging.getLogger(__name__)

_QUERY_FILE = {"tsx": "typescript"}
_SIGNATURE_CHARS = 160
_WS = re.compile(r"\s+")
_FORMAT = b"definitions-with-end-v2"
"""Changes whenever `FileTags`' stored shape changes (part of `queries_version`)."""


@dataclass(frozen=True)
class Definition:
    """A named definition: kind ("function", "class", ...), name, 1-based first line, signature
    text, and the 1-based last line of the whole definition (0 when unknown)."""

    kind: str
    name: str
    line: int
    signature: str
    end_line: int = 0


@dataclass(frozen=True)
class FileTags:
    """What a file defines, uses and imports.

    Attributes:
        definitions: In source order.
        references: Distinct referenced names, sorted.
        imports: Import specs as written ("..utils.x", "./a", "crate::m", '"x.h"'), with
            "mod:NAME" for Rust `mod NAME;` and "sys:PATH" for `#include <PATH>`; sorted.
        error: Why parsing failed, or None.
    """

    definitions: tuple[Definition, ...] = ()
    references: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    error: str | None = None

    def to_msgpack(self) -> list:
        return [[[d.kind, d.name, d.line, d.signature, d.end_line] for d in self.definitions],
                list(self.references), list(self.imports), self.error]

    @classmethod
    def from_msgpack(cls, data: list) -> "FileTags":
        defs, refs, imports, error = data
        return cls(tuple(Definition(*d) for d in defs), tuple(refs), tuple(imports), error)


@lru_cache(maxsize=None)
def query_source(language: str) -> str | None:
    """The text of our tag query for a language, or None for unparsed languages."""
    name = _QUERY_FILE.get(language, language)
    try:
        return resources.files("context.queries").joinpath(f"{name}.scm").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


@lru_cache(maxsize=None)
def _query(language: str) -> tuple[Parser, QueryCursor] | None:
    lang = grammar(language)
    source = query_source(language)
    if lang is None or source is None:
        return None
    try:
        query = Query(lang, source)
    except QueryError as err:
        raise QueryFileError(f"tag query for {language} does not compile: {err}") from err
    return Parser(lang), QueryCursor(query)


def _text(node, data: bytes) -> str:
    return data[node.start_byte:node.end_byte].decode("utf-8", "replace")


def _signature(node, data: bytes) -> str:
    body = node.child_by_field_name("body")
    end = body.start_byte if body is not None and body.start_byte > node.start_byte else node.end_byte
    text = _WS.sub(" ", data[node.start_byte:end].decode("utf-8", "replace")).strip()
    return text if len(text) <= _SIGNATURE_CHARS else text[:_SIGNATURE_CHARS - 1] + "…"


def extract(language: str, text: str) -> FileTags:
    """Tags of one file (parsing now; see `TagCache` for the cached path)."""
    compiled = _query(language)
    if compiled is None:
        return FileTags()
    parser, cursor = compiled
    data = text.encode("utf-8", "surrogatepass")
    try:
        tree = parser.parse(data)
        matches = cursor.matches(tree.root_node)
    except (ValueError, RuntimeError) as err:
        log.debug("parse failed (%s): %s", language, err)
        return FileTags(error=str(err))
    defs: dict[tuple[int, int], Definition] = {}
    refs: set[str] = set()
    imports: set[str] = set()
    for _, caps in matches:
        for cap, nodes in caps.items():
            if cap.startswith("definition."):
                names = caps.get("name")
                if names:
                    node = nodes[0]
                    defs.setdefault((node.start_byte, names[0].start_byte), Definition(
                        cap.split(".", 1)[1], _text(names[0], data), node.start_point[0] + 1,
                        _signature(node, data), node.end_point[0] + 1 - (node.end_point[1] == 0)))
            elif cap == "reference":
                refs.update(_text(n, data) for n in nodes)
        if len(caps) == 1 and ("reference" in caps or "name" in caps):
            continue
        imports.update(_imports(caps, data))
    ordered = tuple(d for _, d in sorted(defs.items()))
    error = "syntax errors" if tree.root_node.has_error else None
    return FileTags(ordered, tuple(sorted(refs)), tuple(sorted(imports)), error)


def _imports(caps: dict, data: bytes) -> list[str]:
    out: list[str] = []
    modules = [_text(n, data) for n in caps.get("import.module", ())]
    names = [_text(n, data) for n in caps.get("import.name", ())]
    for module in modules:
        out.append(module)
        sep = "" if module.endswith(".") else "."
        out.extend(module + sep + name for name in names)
    out.extend("mod:" + _text(n, data) for n in caps.get("import.mod", ()))
    out.extend("sys:" + _text(n, data).strip("<>") for n in caps.get("import.system", ()))
    return out


@lru_cache(maxsize=None)
def queries_version() -> str:
    """Changes when any query file or the tree-sitter version changes (invalidates tag caches)."""
    import tree_sitter

    h = xxhash.xxh3_64(_FORMAT)
    h.update(getattr(tree_sitter, "__version__", "0.26").encode())
    for entry in sorted(resources.files("context.queries").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".scm"):
            h.update(entry.name.encode() + entry.read_bytes())
    return h.hexdigest()


def _tags_row(key: object, value: object) -> bool:
    """A stored row of `FileTags.to_msgpack`'s outline (its definitions unpack as it is read: `_stored_tags`).
    The file's checksum (`context.store`) stands for its bytes; this catches a row of another shape."""
    return isinstance(key, str) and isinstance(value, list) and len(value) == 4 \
        and all(isinstance(part, list) for part in value[:3]) and (value[3] is None or isinstance(value[3], str))


def _stored_tags(raw: list) -> FileTags | None:
    """`FileTags` of a stored row, or None when its definitions do not unpack (then the file is parsed again)."""
    try:
        return FileTags.from_msgpack(raw)
    except TypeError:
        return None


class TagCache:
    """Tags by (language, content hash), persisted under $CODECTX_HOME/tags.msgpack.

    Args:
        path: The cache file; default `$CODECTX_HOME/tags-<queries version>.msgpack`.
        persist: Load from and save to disk.
    """

    def __init__(self, path: Path | None = None, persist: bool = True) -> None:
        self.path = path or codectx_home() / f"tags-{queries_version()}.msgpack"
        self.persist = persist
        self._stored_data: dict | None = None if persist else {}
        self._live: dict[str, FileTags] = {}
        self._dirty = False

    @property
    def _stored(self) -> dict:
        if self._stored_data is None:  # loaded on first need
            self._stored_data = store.load(self.path, _tags_row)
        return self._stored_data

    @_stored.setter
    def _stored(self, value: dict) -> None:
        self._stored_data = value

    def get(self, language: str, text_hash: str, text: str) -> FileTags:
        """Tags of a file whose content hash is `text_hash`."""
        key = f"{language}:{text_hash}"
        tags = self._live.get(key)
        if tags is None:
            raw = self._stored.get(key)
            tags = _stored_tags(raw) if raw is not None else None
            if tags is None:
                tags = extract(language, text)
                self._dirty = True
            self._live[key] = tags
        return tags

    def lookup(self, language: str, text_hash: str) -> FileTags | None:
        """Tags already parsed for this content, or None (nothing is parsed or stored)."""
        key = f"{language}:{text_hash}"
        tags = self._live.get(key)
        raw = self._stored.get(key) if tags is None else None  # one read: `save` may swap the dict meanwhile
        return _stored_tags(raw) if raw is not None else tags

    def save(self) -> None:
        """Writes the entries used in this session (older ones are dropped)."""
        if self.persist and self._dirty:
            self._stored = {k: v.to_msgpack() for k, v in self._live.items()}
            store.save(self.path, self._stored)
            self._dirty = False
