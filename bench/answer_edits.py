"""Edits of a real package's source and questions whose answers the edit changed.

`generate_edits` reads a package's modules with `ast` and builds, for the files
it is given, single edits of real code, each applied to the file's exact text
at the spans `ast` reports (the rest of the file, formatting and comments
included, is untouched), and one question whose right answer is the NEW text
and whose stale answer is the OLD text. Five kinds:

- ``rename``: a top-level function, method or class gets a new name (every
  use in the same file follows, as a rename in the editor does before the
  other files are saved); the question names it by its docstring's first
  sentence, or, without a docstring, by its parameters and return annotation;
- ``caller``: the same rename, asked through a function of the file whose one
  call into the package is the renamed function ("which function does g call");
- ``returns``: a function's return annotation changes (``bytes`` -> ``bytearray`` …);
- ``base``: a class's first base becomes another class defined earlier in the file;
- ``default``: a parameter's literal default changes (a new value).

New names and types come from fixed tables (`RENAME_WORDS`, `RETURN_SWAPS`,
`VALUE_SWAPS`), so the set is fixed by the package version, the files and this
file. Grading: right is bench/answer_questions.py's `grade` (an accepted form in the
first sentence; the lenient score anywhere), as in bench/answers.py; *strict*
and *stale* read the answer the answer states (`stated`: "The X of `y` is `Z`" gives
`Z`): strict when it is a new form, stale when it is an old one (an old form merely
mentioned, "`t.Callable[[bytes], …]`" for the old `bytes`, is counted apart by
`mentions_old`).
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from bench.answer_questions import Question, _callee, _forms, _literal, _private, first_sentence, grade, normalise

KINDS = ("rename", "returns", "base", "default", "caller")
RENAME_WORDS = {"want": "ensure", "base64": "b64", "encode": "pack", "decode": "unpack", "int": "integer",
                "bytes": "octets", "load": "read", "dump": "write", "payload": "body", "loads": "parse",
                "dumps": "render", "Bad": "Invalid", "Signature": "Seal", "Expired": "Lapsed",
                "Header": "Preamble", "Data": "Input", "Payload": "Body", "URL": "Web", "Safe": "Clean",
                "Serializer": "Codec", "Mixin": "Base", "Timed": "Dated", "sign": "stamp", "signer": "stamper",
                "get": "fetch", "Signer": "Stamper", "validate": "check", "unsign": "unstamp"}
RETURN_SWAPS = {"bytes": "bytearray", "str": "bytes", "int": "float", "bool": "int", "None": "bool",
                "t.Any": "object", "float": "int"}
VALUE_SWAPS = {"'utf-8'": "'latin-1'", "'strict'": "'replace'", "'ascii'": "'utf-16'", "True": "False",
               "False": "True", "'.'": "':'"}


@dataclass(frozen=True)
class EditQuestion:
    """One edit of one file and the question it changes the answer of.

    Attributes:
        question: The question; its `accepted` forms are the NEW text.
        stale: Forms of the OLD text (what the unedited file answers).
        path: The edited file, relative to the package folder.
        summary: The edit in a few words (`old -> new`).
        new_text: The whole file after the edit.
    """

    question: Question
    stale: tuple[str, ...]
    path: str
    summary: str
    new_text: str


def mentions_old(answer: str, edit: EditQuestion, anywhere: bool = False) -> bool:
    """Whether an old form occurs where `grade` looks (first sentence, or `anywhere`) and no new one does."""
    old = Question(edit.question.kind, edit.question.text, edit.stale, edit.question.where)
    return grade(answer, old, anywhere) and not grade(answer, edit.question, anywhere)


def stated(answer: str) -> str:
    """What the answer gives as the answer: in its first sentence, the first `code` span after the
    first " is " (the small model answers "The X of `y` is `Z` …"), else the words after the last
    " is ", else the first code span, else the sentence; normalised, a call's arguments dropped."""
    sentence = first_sentence(answer)
    head, sep, rest = sentence.partition(" is ")
    spans = re.findall(r"`([^`]+)`", rest) if sep else []
    if spans:
        said = spans[0]
    elif sep:
        said = sentence.rsplit(" is ", 1)[1]
    else:
        spans = re.findall(r"`([^`]+)`", head)
        said = spans[0] if spans else sentence
    said = normalise(said).rstrip(".,;: ")
    return re.sub(r"^([\w.]+)\(.*$", r"\1", said)


def states(answer: str, forms: tuple[str, ...]) -> bool:
    """Whether the stated answer (`stated`) is one of `forms` (or ends in one after a dot or a space)."""
    said = stated(answer)
    return any(said == f or said.endswith(("." + f, " " + f)) for f in map(normalise, forms) if f)


def is_stale(answer: str, edit: EditQuestion) -> bool:
    """Whether the answer gives the OLD text as the answer (its stated answer is an old form)."""
    return states(answer, edit.stale)


class _Source:
    """One file's text with byte offsets of its lines, and exact span replacement."""

    def __init__(self, text: str) -> None:
        self.data = text.encode("utf-8")
        self.starts = [0] + [m.end() for m in re.finditer(rb"\n", self.data)]

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def replace(self, spans: Iterable[tuple[int, int]], new: str) -> str:
        """The text with every span replaced by `new` (spans may come in any order)."""
        data = self.data
        for start, end in sorted(set(spans), reverse=True):
            data = data[:start] + new.encode("utf-8") + data[end:]
        return data.decode("utf-8")


def new_name(name: str, taken: set[str]) -> str:
    """`name` with its words swapped through `RENAME_WORDS` (snake_case or CamelCase kept);
    `_renamed` appended when no word changes or the result is taken."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z0-9]*|[a-z0-9]+|_", name)
    swapped = "".join(RENAME_WORDS.get(w, w) for w in words)
    return swapped if swapped != name and swapped not in taken else f"{name}_renamed"


def _name_span(src: _Source, node: ast.AST, name: str) -> tuple[int, int]:
    """The span of the name in `def name` / `class name`."""
    line_start = src.offset(node.lineno, node.col_offset)
    match = re.compile(rb"(?:async\s+def|def|class)\s+(" + re.escape(name.encode()) + rb")\b").search(
        src.data, line_start)
    return match.span(1)


def _uses(src: _Source, tree: ast.Module, name: str, method: bool) -> list[tuple[int, int]]:
    """Spans of `name` used in the file: plain names, and for a method `self.name` / `cls.name`."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name:
            spans.append(src.span(node))
        elif method and isinstance(node, ast.Attribute) and node.attr == name \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            end = src.offset(node.end_lineno, node.end_col_offset)
            spans.append((end - len(name.encode()), end))
    return spans


def _docline(node: ast.AST) -> str | None:
    """The docstring's first sentence (first line, up to its first period), when short enough."""
    doc = ast.get_docstring(node)
    if not doc:
        return None
    first = re.split(r"(?<=\.)\s", doc.strip().splitlines()[0], maxsplit=1)[0]
    return first if 12 <= len(first) <= 90 else None


class _Editor:
    """Builds the edits of one module (one list per kind)."""

    def __init__(self, package: str, rel: str, text: str, defined: set[str], signatures: dict[str, int],
                 out: dict[str, list[EditQuestion]]) -> None:
        self.package, self.rel, self.text, self.out = package, rel, text, out
        self.defined, self.signatures = defined, signatures
        self.src, self.tree = _Source(text), ast.parse(text, rel)

    def _add(self, kind: str, text: str, new: tuple[str, ...], old: tuple[str, ...], where: int,
             summary: str, new_text: str) -> None:
        question = Question(kind, text, new, f"{self.rel}:{where}")
        self.out[kind].append(EditQuestion(question, old, self.rel, summary, new_text))

    def run(self) -> None:
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and not _private(node.name):
                self._rename(node, owner=None)
                self._base(node)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._function(item, owner=node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._function(node, owner=None)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> None:
        if _private(node.name) or node.name.startswith("__"):
            return
        self._rename(node, owner)
        self._returns(node, owner)
        self._defaults(node, owner)

    def _rename(self, node: ast.AST, owner: str | None) -> None:
        old = node.name
        new = new_name(old, self.defined)
        spans = [_name_span(self.src, node, old), *_uses(self.src, self.tree, old, owner is not None)]
        new_text = self.src.replace(spans, new)
        what = "class" if isinstance(node, ast.ClassDef) else "method" if owner else "function"
        place = f"the {what} of `{owner}` in `{self.rel}`" if owner else f"the {what} in `{self.rel}`"
        doc = _docline(node)
        if doc is not None:
            text = f'What is the name of {place} whose docstring begins "{doc}"?'
        elif what != "class" and node.returns is not None and self.signatures.get(_signature(node)) == 1:
            text = (f"What is the name of {place} that takes `({ast.unparse(node.args)})` and returns "
                    f"`{ast.unparse(node.returns)}`?")
        else:
            text = None
        summary = f"rename {old} -> {new}"
        if text is not None:
            self._add("rename", text, (new,), (old,), node.lineno, summary, new_text)
        if what == "function":
            for caller in self.tree.body:
                if isinstance(caller, ast.FunctionDef) and caller is not node and not _private(caller.name) \
                        and self._callees(caller) == {old}:
                    self._add("caller", f"Name a function of {self.package} that `{caller.name}` calls.",
                              (new,), (old,), caller.lineno, summary, new_text)

    def _callees(self, node: ast.FunctionDef) -> set[str]:
        return {_callee(c) for c in ast.walk(node) if isinstance(c, ast.Call)} & self.defined - {node.name}

    def _returns(self, node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> None:
        if node.returns is None:
            return
        old = ast.unparse(node.returns)
        new = RETURN_SWAPS.get(old, "object" if old != "object" else "t.Any")
        name, kind = (f"{owner}.{node.name}", "method") if owner else (node.name, "function")
        self._add("returns", f"What is the return type annotation of the {kind} `{name}`?", _forms(new),
                  _forms(old), node.lineno, f"{name} returns {old} -> {new}",
                  self.src.replace([self.src.span(node.returns)], new))

    def _defaults(self, node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str | None) -> None:
        args = node.args.args + node.args.kwonlyargs
        defaults = [None] * (len(node.args.args) - len(node.args.defaults)) + list(node.args.defaults)
        defaults += list(node.args.kw_defaults)
        name = f"{owner}.{node.name}" if owner else node.name
        for arg, default in zip(args, defaults):
            old = _literal(default) if default is not None else None
            if old is None or old not in VALUE_SWAPS:
                continue
            new = VALUE_SWAPS[old]
            self._add("default", f"What is the default value of the parameter `{arg.arg}` of `{name}`?", (new,),
                      (old,), node.lineno, f"{name}({arg.arg}={old} -> {new})",
                      self.src.replace([self.src.span(default)], new))

    def _base(self, node: ast.ClassDef) -> None:
        if not node.bases:
            return
        old = ast.unparse(node.bases[0])
        earlier = [n.name for n in self.tree.body if isinstance(n, ast.ClassDef) and n.lineno < node.lineno]
        others = [name for name in earlier if name not in (old, node.name) and not _private(name)]
        if not others:
            return
        new = others[0]
        self._add("base", f"What is the base class of the class `{node.name}`?", (new,), _forms(old), node.lineno,
                  f"{node.name}({old} -> {new})", self.src.replace([self.src.span(node.bases[0])], new))


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"({ast.unparse(node.args)}) -> {ast.unparse(node.returns) if node.returns else ''}"


def generate_edits(source: Path, package: str, files: Iterable[str]) -> list[EditQuestion]:
    """Edits of `files` (paths relative to `source`) and their questions, interleaved kind by kind.

    Args:
        source: The package's folder (site-packages/<package>).
        package: Its import name (in question texts).
        files: The files to edit (the bench passes those whose edited copy can join the hot tail).
    """
    trees = {p.relative_to(source).as_posix(): p.read_text(encoding="utf-8") for p in sorted(source.rglob("*.py"))}
    defined: set[str] = set()
    signatures: dict[str, int] = {}
    for text in trees.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                signatures[_signature(node)] = signatures.get(_signature(node), 0) + 1
    out: dict[str, list[EditQuestion]] = {kind: [] for kind in KINDS}
    for rel in sorted(set(files)):
        _Editor(package, rel, trees[rel], defined, signatures, out).run()
    return _interleave(out)


def _interleave(by_kind: dict[str, list[EditQuestion]]) -> list[EditQuestion]:
    """Round-robin over the kinds (one question per text; a text asked twice is dropped)."""
    counts: dict[str, int] = {}
    for edits in by_kind.values():
        for e in edits:
            counts[e.question.text] = counts.get(e.question.text, 0) + 1
    queues = {kind: [e for e in edits if counts[e.question.text] == 1] for kind, edits in by_kind.items()}
    out: list[EditQuestion] = []
    while any(queues.values()):
        for kind in KINDS:
            if queues[kind]:
                out.append(queues[kind].pop(0))
    return out


def fingerprint(edits: list[EditQuestion]) -> str:
    """A short hash of the set (questions, answers, edits): equal sets, equal hashes."""
    blob = json.dumps([asdict(e) for e in edits], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
