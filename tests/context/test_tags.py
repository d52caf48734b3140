"""Per-language tag extraction with our own queries, and graceful degradation."""
from __future__ import annotations

import pytest

from context.imports import ImportResolver
from context.languages import PARSED_LANGUAGES, language_of
from context.tags import TagCache, extract

import fixture_repo

CASES = {
    "pkg/core.py": ("python", {("class", "Core"), ("function", "run")}, {".util", ".util.helper"}, {"helper"}),
    "web/src/index.ts": ("typescript", {("function", "total")}, {"./lib"}, {"add"}),
    "web/src/view.tsx": ("tsx", {("function", "View")}, {"./index"}, {"total"}),
    "web/src/legacy.js": ("javascript", {("function", "legacy")}, {"./lib"}, {"add"}),
    "cmd/demo/main.go": ("go", {("function", "main")}, {'"example.com/demo/internal/store"'}, {"New"}),
    "internal/store/store.go": ("go", {("type", "Store"), ("function", "New")}, set(), {"Store"}),
    "crate/src/lib.rs": ("rust", {("function", "parse")}, {"mod:parser", "crate::parser::Parser"}, {"Parser"}),
    "crate/src/parser.rs": ("rust", {("struct", "Parser"), ("function", "new")}, set(), set()),
    "java/com/demo/App.java": ("java", {("class", "App"), ("method", "main")}, {"com.demo.util.Strings"}, {"twice"}),
    "native/vec.c": ("c", {("function", "vec_len")}, {'"vec.h"'}, {"vec"}),
    "native/vec.h": ("c", {("type", "vec"), ("function", "vec_len"), ("macro", "VEC_H")}, set(), set()),
    "native/shape.cpp": ("cpp", {("function", "Shape::area")}, {'"shape.hpp"'}, set()),
    "native/shape.hpp": ("cpp", {("class", "Shape"), ("method", "area")}, set(), set()),
}


@pytest.mark.parametrize("path", sorted(CASES))
def test_definitions_imports_references(path):
    language, defs, imports, refs = CASES[path]
    assert language_of(path) == language
    tags = extract(language, fixture_repo.FILES[path])
    assert tags.error is None
    assert {(d.kind, d.name) for d in tags.definitions} >= defs
    assert set(tags.imports) >= imports
    assert set(tags.references) >= refs


def test_every_parsed_language_has_a_compiling_query():
    for language in PARSED_LANGUAGES:
        assert extract(language, "").error is None


def test_signature_stops_at_body():
    tags = extract("python", "def f(a,\n      b) -> int:\n    return a\n")
    assert tags.definitions[0].signature == "def f(a, b) -> int:"
    assert tags.definitions[0].line == 1


def test_unknown_language_and_broken_code_degrade():
    assert extract("text", "anything (").definitions == ()
    broken = extract("python", "def ok():\n    pass\n\ndef broken(:\n")
    assert broken.error == "syntax errors"
    assert "ok" in {d.name for d in broken.definitions}


def test_imports_resolve_to_files():
    resolver = ImportResolver(fixture_repo.FILES, "demo", fixture_repo.FILES["go.mod"])
    assert resolver.resolve("pkg/core.py", "python", ".util.helper") == ["pkg/util.py"]
    assert resolver.resolve("app.py", "python", "pkg.core.Core") == ["pkg/core.py"]
    assert resolver.resolve("web/src/index.ts", "typescript", "./lib") == ["web/src/lib.ts"]
    assert resolver.resolve("cmd/demo/main.go", "go", '"example.com/demo/internal/store"') == ["internal/store/store.go"]
    assert resolver.resolve("crate/src/lib.rs", "rust", "mod:parser") == ["crate/src/parser.rs"]
    assert resolver.resolve("crate/src/lib.rs", "rust", "crate::parser::Parser") == ["crate/src/parser.rs"]
    assert resolver.resolve("java/com/demo/App.java", "java", "com.demo.util.Strings") == \
        ["java/com/demo/util/Strings.java"]
    assert resolver.resolve("native/vec.c", "c", '"vec.h"') == ["native/vec.h"]
    assert resolver.resolve("app.py", "python", "numpy") == []


def test_tag_cache_persists_by_content_hash(tmp_path):
    path = tmp_path / "tags.msgpack"
    cache = TagCache(path)
    first = cache.get("python", "h1", "def a():\n    pass\n")
    cache.save()
    again = TagCache(path).get("python", "h1", "this text is not parsed because the hash hits")
    assert again == first and again.definitions[0].name == "a"
