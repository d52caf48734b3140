"""Questions with checkable answers about an installed Python package, and their grading.

`install_package` puts a pinned package from PyPI into a venv under a cache
folder (created once, reused); `generate` reads the package's source with the
standard library's `ast` and extracts questions whose expected answers come
from the code itself (nothing is hand-typed), so the set is fixed by the
package version and this file. Six kinds:

- ``module``: which module defines a class or top-level function (names defined once);
- ``constant``: the value of a module- or class-level assignment of a literal;
- ``returns``: a function's return annotation;
- ``calls``: name a function of the package that a function calls;
- ``default``: a parameter's default value (``None`` defaults are left out);
- ``base``: a class's first base class.

Grading (`grade`): the answer's first sentence (its first non-empty line, up
to the first period followed by a space) and every accepted form are
normalised (lower case; ``b'…'`` prefixes, quotes and backticks dropped;
whitespace collapsed), and the answer is right when an accepted form occurs in
that sentence as a whole token (not preceded or followed by a letter, digit or
underscore). Only the first sentence counts because the small model's answers
often go on to list alternatives ("`'ascii'` … it can be `'ascii'` or
`'utf-8'`"); `grade(..., anywhere=True)` searches the whole answer (reported
beside it as the lenient score). Accepted forms:
``module``: ``<mod>.py``, ``<pkg>.<mod>``, ``<pkg>/<mod>``, ``<mod> module``;
``returns`` / ``base``: the annotation or base as written, and its last dotted
name for a plain ``a.B``; ``calls``: any called name defined in the package.
The matcher is tolerant by design: an answer that lists many names can hit one
by chance, so accuracy is an upper bound on understanding, the same for every arm.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess
import sys
import venv
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("module", "constant", "returns", "calls", "default", "base")


@dataclass(frozen=True)
class Question:
    """One question and the forms of its answer that count as right."""

    kind: str
    text: str
    accepted: tuple[str, ...]
    where: str


class InstallError(Exception):
    """The package could not be installed from PyPI."""


def install_package(package: str, version: str, cache: Path) -> Path:
    """The source folder of `package`==`version` in a venv under `cache` (installed on first use).

    Raises:
        InstallError: pip failed or the package has no folder in site-packages.
    """
    env_dir = cache / f"{package}-{version}"
    marker = env_dir / "installed.txt"
    if not marker.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
        python = env_dir / "bin" / "python"
        done = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                               "-q", f"{package}=={version}"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise InstallError(f"pip install {package}=={version}: {done.stderr.strip()[-400:]}")
        marker.write_text(f"{package}=={version}\n", encoding="utf-8")
    found = sorted(env_dir.glob(f"lib/python*/site-packages/{package.replace('-', '_')}"))
    if not found or not found[0].is_dir():
        raise InstallError(f"{package}=={version} installed no folder {package} in {env_dir}")
    return found[0]


def _literal(node: ast.AST) -> str | None:
    """The source of a literal constant (str, bytes, number, bool), or None."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, (str, bytes, int, float, bool)) and value is not None and len(repr(value)) <= 40:
        return ast.unparse(node)
    return None


def _forms(expr: str) -> tuple[str, ...]:
    """An annotation or base as written, and its last dotted name for a plain `a.B`."""
    expr = expr.strip("'\"")
    last = expr.rsplit(".", 1)[-1]
    return (expr, last) if re.fullmatch(r"[\w.]+", expr) and last != expr else (expr,)


class _Collector:
    """Walks one module and adds its questions (one list per kind)."""

    def __init__(self, package: str, defined: set[str], out: dict[str, list[Question]]) -> None:
        self.package, self.defined, self.out = package, defined, out

    def module(self, mod: str, tree: ast.Module) -> None:
        for node in tree.body:
            self._node(mod, node, owner=None)

    def _add(self, kind: str, text: str, accepted: tuple[str, ...], where: str) -> None:
        self.out[kind].append(Question(kind, text, accepted, where))

    def _node(self, mod: str, node: ast.AST, owner: str | None) -> None:
        where = f"{mod}.py:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ClassDef):
            if _private(node.name):
                return
            if node.bases:
                base = ast.unparse(node.bases[0])
                self._add("base", f"What is the base class of the class `{node.name}`?", _forms(base), where)
            for item in node.body:
                self._node(mod, item, owner=node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._function(mod, node, owner, where)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = _literal(node.value)
            if value is not None and len(targets) == 1 and isinstance(targets[0], ast.Name):
                name = f"{owner}.{targets[0].id}" if owner else targets[0].id
                self._add("constant", f"What value is `{name}` set to in `{mod}.py`?", (value,), where)

    def _function(self, mod: str, node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None,
                  where: str) -> None:
        if _private(node.name) or any(ast.unparse(d).rsplit(".", 1)[-1] == "overload" for d in node.decorator_list):
            return  # overload stubs: one name, several signatures, no single answer
        name = f"{owner}.{node.name}" if owner else node.name
        kind = "method" if owner else "function"
        if node.returns is not None:
            self._add("returns", f"What is the return type annotation of the {kind} `{name}`?",
                      _forms(ast.unparse(node.returns)), where)
        args = node.args.args + node.args.kwonlyargs
        defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + list(node.args.defaults)
        defaults += list(node.args.kw_defaults)
        for arg, default in zip(args, defaults):
            if default is not None and ast.unparse(default) != "None":
                self._add("default", f"What is the default value of the parameter `{arg.arg}` of `{name}`?",
                          (ast.unparse(default),), where)
        callees = sorted({_callee(c) for c in ast.walk(node) if isinstance(c, ast.Call)} & self.defined - {node.name})
        if callees:
            self._add("calls", f"Name a function or method of {self.package} that `{name}` calls.",
                      tuple(callees), where)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _callee(call: ast.Call) -> str:
    """The called name for `f(…)`, `self.f(…)` and `cls.f(…)` (other receivers: unknown types)."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"):
        return func.attr
    return ""


def _modules(source: Path) -> list[tuple[str, ast.Module]]:
    """(dotted module name without the package, tree) for every .py file, by path."""
    out = []
    for path in sorted(source.rglob("*.py")):
        rel = path.relative_to(source).with_suffix("")
        out.append((".".join(rel.parts), ast.parse(path.read_text(encoding="utf-8"), str(path))))
    return out


def generate(source: Path, package: str) -> list[Question]:
    """Every question of every kind, interleaved kind by kind (so a prefix `[:n]` mixes kinds).

    Args:
        source: The package's folder (site-packages/<package>).
        package: Its import name, used in question texts and accepted module forms.
    """
    modules = _modules(source)
    owners: dict[str, set[str]] = {}
    defined: set[str] = set()
    for mod, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                owners.setdefault(node.name, set()).add(mod)
    out: dict[str, list[Question]] = {kind: [] for kind in KINDS}
    collector = _Collector(package, defined, out)
    for mod, tree in modules:
        if mod.rsplit(".", 1)[-1] != "__init__":
            collector.module(mod, tree)
    for name, mods in sorted(owners.items()):
        if len(mods) == 1 and not name.startswith("_"):
            mod = next(iter(mods))
            path = mod.replace(".", "/")
            out["module"].append(Question("module", f"Which module of {package} defines `{name}`?",
                                          (f"{path}.py", f"{package}.{mod}", f"{package}/{path}", f"{mod} module"),
                                          f"{path}.py"))
    return _interleave({kind: _unambiguous(qs) for kind, qs in out.items()})


def _unambiguous(questions: list[Question]) -> list[Question]:
    """One question per text; a text asked with different answers (a name defined twice) is dropped."""
    answers: dict[str, set[tuple[str, ...]]] = {}
    for q in questions:
        answers.setdefault(q.text, set()).add(q.accepted)
    seen: set[str] = set()
    out = []
    for q in questions:
        if len(answers[q.text]) == 1 and q.text not in seen:
            seen.add(q.text)
            out.append(q)
    return out


def _interleave(by_kind: dict[str, list[Question]]) -> list[Question]:
    """Round-robin over the kinds; within a kind, questions spread evenly over the source."""
    queues = {kind: _spread(qs) for kind, qs in by_kind.items()}
    out: list[Question] = []
    while any(queues.values()):
        for kind in KINDS:
            if queues[kind]:
                out.append(queues[kind].pop(0))
    return out


def _spread(questions: list[Question]) -> list[Question]:
    """Every other question first, then the rest: early prefixes cover the whole package."""
    return questions[::2] + questions[1::2]


def normalise(text: str) -> str:
    """Lower case, ``b'…'`` prefixes, quotes and backticks dropped, whitespace collapsed."""
    text = re.sub(r"\bb(['\"])", r"\1", text.lower())
    return " ".join(re.sub(r"[`'\"]", "", text).split())


def first_sentence(answer: str) -> str:
    """The first non-empty line of `answer`, up to the first period followed by whitespace."""
    line = next((ln for ln in answer.strip().splitlines() if ln.strip()), "")
    return re.split(r"(?<=\.)\s", line.strip(), maxsplit=1)[0]


def grade(answer: str, question: Question, anywhere: bool = False) -> bool:
    """Whether an accepted form occurs in the answer's first sentence (or, `anywhere`, in all of
    it) as a whole token (module docstring)."""
    said = normalise(answer if anywhere else first_sentence(answer))
    for form in question.accepted:
        want = normalise(form)
        if want and re.search(r"(?<![a-z0-9_])" + re.escape(want) + r"(?![a-z0-9_])", said):
            return True
    return False


def fingerprint(questions: list[Question]) -> str:
    """A short hash of the question set (texts and accepted forms): equal sets, equal hashes."""
    blob = json.dumps([asdict(q) for q in questions], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


if __name__ == "__main__":  # list the questions of an already installed package folder
    for q in generate(Path(sys.argv[1]), sys.argv[2]):
        sys.stdout.write(f"[{q.kind}] {q.text}  ->  {' | '.join(q.accepted)}  ({q.where})\n")
