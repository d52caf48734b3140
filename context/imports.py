"""Import specs (as `tags` captured them) -> workspace files, per language.

Resolution is by path conventions only (no build system is run): Python module
names, relative JS/TS specifiers, Go module paths from go.mod, Rust `mod`/`use
crate::`, Java class names and C/C++ includes. Unresolvable imports (third-party,
system) are ignored.
"""
from __future__ import annotations

import posixpath
import re
from functools import lru_cache
from typing import Iterable

_JS_SUFFIXES = ("", ".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", ".d.ts",
                "/index.ts", "/index.tsx", "/index.js", "/index.jsx")
_PY_ROOTS = ("src/", "lib/", "python/")
_GO_MODULE = re.compile(r"^module\s+(\S+)", re.M)


class ImportResolver:
    """Indexes the workspace's paths once; resolves imports in O(parts) each.

    Args:
        paths: Every kept file's relative path.
        root_name: The workspace folder's name (a package's imports may start with it).
        go_mod: Text of the root go.mod, if any.
    """

    def __init__(self, paths: Iterable[str], root_name: str = "", go_mod: str | None = None) -> None:
        self.paths = set(paths)
        self.root_name = root_name
        self.py_modules: dict[str, str] = {}
        self.by_suffix: dict[str, list[str]] = {}
        self.dirs: dict[str, list[str]] = {}
        self._memo: dict[tuple[str, str, str], tuple[str, ...]] = {}
        for p in sorted(self.paths):
            self.add(p)
        found = _GO_MODULE.search(go_mod or "")
        self.go_module = found.group(1) if found else None

    def add(self, path: str) -> None:
        """Indexes one more path (a file created after the build)."""
        self.paths.add(path)
        self._memo.clear()
        self.dirs.setdefault(posixpath.dirname(path), []).append(path)
        name = posixpath.basename(path)
        self.by_suffix.setdefault(name, []).append(path)
        if path.endswith((".py", ".pyi")):
            for module in _python_names(path, self.root_name):
                self.py_modules.setdefault(module, path)

    def resolve(self, path: str, language: str, spec: str) -> list[str]:
        """The workspace files an import of `spec` in `path` refers to (maybe none)."""
        # Files of one folder import the same things: memoize by (folder, language, spec).
        key = (_dirname(path) if spec.startswith((".", "mod:", '"', "crate::")) else "", language, spec)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = tuple(self._resolve(path, language, spec))
        return list(hit)

    def _resolve(self, path: str, language: str, spec: str) -> list[str]:
        if language == "python":
            return _nonempty(self._python(path, spec))
        if language in ("javascript", "typescript", "tsx"):
            return _nonempty(self._js(path, spec))
        if language == "go":
            return self._go(spec.strip('"`'))
        if language == "rust":
            return _nonempty(self._rust(path, spec))
        if language == "java":
            return _nonempty(self._suffix(spec.replace(".", "/") + ".java"))
        if language in ("c", "cpp"):
            return _nonempty(self._include(path, spec))
        return []

    def _python(self, path: str, spec: str) -> str | None:
        if spec.startswith("."):
            level = len(spec) - len(spec.lstrip("."))
            folder = _dirname(path)
            package = folder.split("/") if folder else []
            if level - 1 > len(package):
                return None
            base = package[:len(package) - (level - 1)]
            rest = spec[level:]
            spec = ".".join(base + ([rest] if rest else []))
            if not spec:
                return self.py_modules.get("__init__") if "__init__.py" in self.paths else None
        parts = spec.split(".")
        for n in range(len(parts), 0, -1):
            hit = self.py_modules.get(".".join(parts[:n]))
            if hit:
                return hit
        return None

    def _js(self, path: str, spec: str) -> str | None:
        if not spec.startswith("."):
            return None
        base = posixpath.normpath(posixpath.join(posixpath.dirname(path), spec))
        stem = re.sub(r"\.(js|jsx|mjs|cjs)$", "", base)
        for candidate in [base] + [stem + s for s in _JS_SUFFIXES]:
            if candidate in self.paths:
                return candidate
        return None

    def _go(self, spec: str) -> list[str]:
        if not self.go_module or not (spec == self.go_module or spec.startswith(self.go_module + "/")):
            return []
        folder = spec[len(self.go_module):].lstrip("/")
        return sorted(p for p in self.dirs.get(folder, ()) if p.endswith(".go") and not p.endswith("_test.go"))

    def _rust(self, path: str, spec: str) -> str | None:
        here = posixpath.dirname(path)
        if spec.startswith("mod:"):
            name = spec[4:]
            stem = posixpath.basename(path)[:-3]
            folder = here if stem in ("mod", "lib", "main") else posixpath.join(here, stem)
            for candidate in (f"{folder}/{name}.rs", f"{folder}/{name}/mod.rs"):
                candidate = candidate.lstrip("/")
                if candidate in self.paths:
                    return candidate
            return None
        if not spec.startswith("crate::"):
            return None
        src = here[: here.rfind("src") + 3] if "src" in here.split("/") else here
        parts = re.split(r"::", spec[len("crate::"):].split("{")[0])
        parts = [p for p in parts if p and p != "*"]
        for n in range(len(parts), 0, -1):
            folder = "/".join([src] + parts[:n]).lstrip("/")
            for candidate in (folder + ".rs", folder + "/mod.rs"):
                if candidate in self.paths:
                    return candidate
        return None

    def _include(self, path: str, spec: str) -> str | None:
        system = spec.startswith("sys:")
        name = spec[4:] if system else spec.strip('"')
        if not system:
            local = posixpath.normpath(posixpath.join(posixpath.dirname(path), name))
            if local in self.paths:
                return local
        if name in self.paths:
            return name
        return self._suffix(name)

    def _suffix(self, tail: str) -> str | None:
        hits = sorted(p for p in self.by_suffix.get(posixpath.basename(tail), ())
                      if p == tail or p.endswith("/" + tail))
        return hits[0] if hits else None


_dirname = lru_cache(maxsize=None)(posixpath.dirname)


def _nonempty(hit: str | None) -> list[str]:
    return [hit] if hit else []


def _python_names(path: str, root_name: str) -> list[str]:
    stem = path.rsplit(".", 1)[0]
    if stem.endswith("/__init__") or stem == "__init__":
        stem = stem[: -len("__init__")].rstrip("/") or "__init__"
    module = stem.replace("/", ".")
    names = [module]
    for root in _PY_ROOTS:
        if path.startswith(root):
            names.append(module[len(root):])
    if root_name and module != "__init__":
        names.append(f"{root_name}.{module}")
    elif root_name:
        names.append(root_name)
    return names
