"""Benchmark of incremental document sync: one-line edits in a 10 MB buffer.

Measures, in one run and on the same document and edits (typing one character at a
random place, UTF-16 positions, lines with accents and emoji):

* `DocumentStore.change` (server/lsp/documents.py: the line buffer; the goal is
  < 5 ms per edit), also for edits that add or remove a line;
* the naive reference: one flat string, every line bound found again and the
  whole string rebuilt per edit (how codectx applied edits before);
* pygls' own `TextDocument.apply_change` (pygls kept this second copy of every
  open document, updated on every edit, before `CodectxProtocol` dropped it);
* reading `.text` once after an edit (the line buffer joins lazily).

Prints a table (median and p95 per edit, in ms) and writes JSON to bench/results/.

    python bench/lsp_sync.py [--megabytes 10] [--edits 300] [--naive-edits 30]
"""
from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lsprotocol import types  # noqa: E402
from pygls.workspace import TextDocument  # noqa: E402

from bench._common import machine, markdown_table, write_json  # noqa: E402
from server.lsp.convert import UTF16, unit_length  # noqa: E402
from server.lsp.documents import DocumentStore  # noqa: E402

URI = "file:///bench/big.py"
BLOCK = [
    "def handler_{n}(request, café='é'):",
    "    \"\"\"Answers one request 🙂 and logs it.\"\"\"",
    "    value = request.get('key', None)  # ümlaut",
    "    if value is None:",
    "        return {'status': 404, 'body': '没有'}",
    "    return {'status': 200, 'body': str(value) * 2}",
    "",
]


def make_document(megabytes: float) -> str:
    lines, size, n = [], 0, 0
    while size < megabytes * 1_000_000:
        for line in BLOCK:
            text = line.replace("{n}", str(n)) + "\n"
            lines.append(text)
            size += len(text.encode("utf-8"))
        n += 1
    return "".join(lines)


def random_edits(text: str, count: int, kind: str, seed: int = 7) -> list[types.TextDocumentContentChangePartial]:
    """`count` edits at random (line, UTF-16 column) places: "type" inserts one character,
    "enter" inserts a line break, "join" deletes a line break (the line count changes)."""
    rng = random.Random(seed)
    lines = text.split("\n")
    edits = []
    for _ in range(count):
        line = rng.randrange(len(lines) - 2)
        at = types.Position(line, rng.randrange(unit_length(lines[line], UTF16) + 1))
        if kind == "join":
            at = types.Position(line, unit_length(lines[line], UTF16))
            rng_ = types.Range(start=at, end=types.Position(line + 1, 0))
        else:
            rng_ = types.Range(start=at, end=at)
        edits.append(types.TextDocumentContentChangePartial(range=rng_, text="\n" if kind == "enter" else
                                                            "" if kind == "join" else "x"))
    return edits


_LINE_END = re.compile(r"\r\n|\r|\n")


def naive_apply(text: str, change: types.TextDocumentContentChangePartial) -> str:
    """The reference: line bounds of the whole text, then a rebuilt string."""
    def offset(position: types.Position) -> int:
        bounds, start = [], 0
        for match in _LINE_END.finditer(text):
            bounds.append((start, match.start()))
            start = match.end()
        bounds.append((start, len(text)))
        if position.line >= len(bounds):
            return len(text)
        start, end = bounds[position.line]
        seen = 0
        for index, ch in enumerate(text[start:end]):
            if seen >= position.character:
                return start + index
            seen += 2 if ord(ch) > 0xFFFF else 1
        return end

    a, b = offset(change.range.start), offset(change.range.end)
    return text[:a] + change.text + text[b:]


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def timed(run, edits) -> list[float]:
    samples = []
    for edit in edits:
        start = time.perf_counter()
        run(edit)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=float, default=10)
    parser.add_argument("--edits", type=int, default=300)
    parser.add_argument("--naive-edits", type=int, default=30, help="edits for the two slow references")
    args = parser.parse_args()

    text = make_document(args.megabytes)
    edits = random_edits(text, args.edits, "type")
    store = DocumentStore(UTF16)
    start = time.perf_counter()
    store.open(types.TextDocumentItem(uri=URI, language_id="python", version=1, text=text))
    open_ms = (time.perf_counter() - start) * 1000
    version = iter(range(2, 10**9))

    def line_buffer(edit) -> None:
        store.change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=next(version)),
            content_changes=[edit]))

    def line_buffer_then_text(edit) -> None:
        line_buffer(edit)
        store.get(URI).text  # noqa: B018 - the lazy join is what is measured

    state = {"text": text}

    def naive(edit) -> None:
        state["text"] = naive_apply(state["text"], edit)

    pygls_doc = TextDocument(URI, text, version=1)  # UTF-16, its default

    rows = [("line buffer: type a character", timed(line_buffer, edits)),
            ("line buffer: insert a line break", timed(line_buffer, random_edits(text, args.edits, "enter", 8))),
            ("line buffer: delete a line break", timed(line_buffer, random_edits(text, args.edits, "join", 9))),
            ("line buffer: type, then read .text", timed(line_buffer_then_text, edits[:args.naive_edits])),
            ("naive reference (flat string): type", timed(naive, edits[:args.naive_edits])),
            ("pygls TextDocument.apply_change: type", timed(pygls_doc.apply_change, edits[:args.naive_edits]))]
    assert store.get(URI).text.count("x") == text.count("x") + args.edits + args.naive_edits  # edits landed

    lines = text.count("\n")
    print(f"document: {len(text.encode('utf-8')) / 1e6:.1f} MB, {lines} lines; open: {open_ms:.0f} ms")
    table = [(name, len(samples), statistics.median(samples), percentile(samples, 0.95))
             for name, samples in rows]
    print(markdown_table(["edit (10 MB buffer)" if args.megabytes == 10 else "edit", "edits", "median ms", "p95 ms"],
                         [(name, n, f"{median:.3f}", f"{p95:.3f}") for name, n, median, p95 in table]))
    path = write_json("lsp_sync", {
        "machine": machine(), "megabytes": len(text.encode("utf-8")) / 1e6, "lines": lines, "open_ms": open_ms,
        "rows": [{"name": name, "edits": n, "median_ms": median, "p95_ms": p95} for name, n, median, p95 in table],
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
