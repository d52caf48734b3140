"""File extension -> language, and tree-sitter grammars from the per-language wheels."""
from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import PurePosixPath

from tree_sitter import Language

_BY_SUFFIX = {
    ".py": "python", ".pyi": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp", ".hpp": "cpp", ".hh": "cpp",
    ".hxx": "cpp", ".h++": "cpp", ".ipp": "cpp",
    ".md": "markdown", ".rst": "rst", ".txt": "text", ".toml": "toml", ".yaml": "yaml",
    ".yml": "yaml", ".json": "json", ".sh": "shell", ".lua": "lua", ".html": "html",
    ".css": "css", ".scm": "query", ".cfg": "ini", ".ini": "ini",
}
_GRAMMARS = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
}
PARSED_LANGUAGES = tuple(_GRAMMARS)


def language_of(path: str) -> str:
    """The language name of a path ("text" when unknown)."""
    p = PurePosixPath(path)
    if p.name in ("Makefile", "Dockerfile"):
        return p.name.lower()
    return _BY_SUFFIX.get(p.suffix.lower(), "text")


@lru_cache(maxsize=None)
def grammar(language: str) -> Language | None:
    """The tree-sitter grammar of a language, or None when no grammar wheel is installed."""
    spec = _GRAMMARS.get(language)
    if spec is None:
        return None
    try:
        module = importlib.import_module(spec[0])
    except ImportError:
        return None
    return Language(getattr(module, spec[1])())
