"""The code's shape, read from the source: the server's transports over one core, no import
cycles among the product's modules (server, engine, context), small modules and functions
everywhere. `pytest -s` prints the server's import graph and module sizes."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.server.harness import REPO_ROOT

SERVER = REPO_ROOT / "server"
PRODUCT = ("server", "engine", "context")
SIZED = PRODUCT + ("bench", "tests", "scripts", "editors")  # every Python file we write
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(packages: tuple[str, ...] = ("server",)) -> dict[str, Path]:
    return {module_name(path): path for package in packages for path in sorted((REPO_ROOT / package).rglob("*.py"))
            if "node_modules" not in path.parts}


def imported(path: Path, name: str, known: set[str]) -> set[str]:
    """Every module of `known` that `path` (module `name`) imports, anywhere in the file
    (lazy imports inside functions count: they run too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from package import module` imports the module; `from module import name` the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(packages: tuple[str, ...] = ("server",)) -> dict[str, set[str]]:
    found = modules(packages)
    known = set(found)
    return {name: imported(path, name, known) for name, path in found.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_http_imports_nothing_from_the_language_server():
    graph = import_graph()
    offending = {name: sorted(t for t in targets if t == "server.lsp" or t.startswith("server.lsp."))
                 for name, targets in graph.items() if name.startswith("server.http")}
    assert {name: targets for name, targets in offending.items() if targets} == {}


def test_the_core_imports_no_transport():
    graph = import_graph()
    offending = {name: sorted(t for t in targets if t.startswith(("server.lsp", "server.http")))
                 for name, targets in graph.items() if name.startswith("server.core")}
    assert {name: targets for name, targets in offending.items() if targets} == {}
    for name, path in modules().items():
        if name.startswith("server.core"):
            text = path.read_text(encoding="utf-8")
            assert not any(f"import {lib}" in text or f"from {lib}" in text
                           for lib in ("pygls", "lsprotocol", "starlette")), name


def test_no_import_cycles_among_product_modules():
    graph = import_graph(PRODUCT)
    print("\nimport graph of server/ (module: lines -> server modules it imports)")
    for name, path in modules().items():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        print(f"  {name}: {lines} -> {', '.join(sorted(t for t in graph[name] if t.startswith('server'))) or '-'}")
    assert cycle(graph) is None


def test_context_and_engine_import_no_server_module():
    graph = import_graph(PRODUCT)
    offending = {name: sorted(t for t in targets if t.startswith("server"))
                 for name, targets in graph.items() if name.startswith(("engine", "context"))}
    assert {name: targets for name, targets in offending.items() if targets} == {}


def test_the_cycle_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_modules_and_functions_stay_small():
    too_long = []
    for name, path in modules(SIZED).items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert too_long == []
