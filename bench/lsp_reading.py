"""A replayed reading session through a real LSP client: how many hovers show the model's
complete answer at once.

Hovers do not stream: what a user reads is the complete answer, or the static card with
its "explanation pending" line (the default `hover.latencyBudgetMs` is 0). The session
opens the largest module of a real PyPI package (`itsdangerous` 2.2.0 by default, the
package `bench/answers.py` asks about), hovers on its definitions in reading order with
pauses of 1-3 s (seeded), edits one of them and hovers on it again: one session, with a
fresh server, per seed (how far ahead preparation stays depends on the reader's pace). A
hover whose answer is pending is hovered again every 100 ms in the background until the
answer shows (at most 30 s: "never"), as a user coming back to it would see it.

Also measured: a hover sent right after `initialize`, while the model loads (the static
card; goal < 100 ms).

Goal on this CPU with the default model: >= 80% of hovers show the complete answer
within 100 ms. Prints a table and writes JSON to bench/results/.

    python bench/lsp_reading.py [--model smollm2-135m] [--hovers 20] [--seeds 0,1,2,3,4]
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import machine, markdown_table, write_json  # noqa: E402
from bench.answer_questions import install_package  # noqa: E402
from bench.lsp import Client  # noqa: E402
from server.core.features.hover import LOADING_LINE, PENDING_LINE  # noqa: E402

POLL_S = 0.1
NEVER_S = 30.0
BUCKETS = (("<= 100 ms", 0.1), ("<= 1 s", 1.0), (f"<= {NEVER_S:.0f} s", NEVER_S))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--package", default="itsdangerous")
    parser.add_argument("--version", default="2.2.0")
    parser.add_argument("--hovers", type=int, default=20, help="definitions hovered in reading order")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds of the pauses, one session each")
    parser.add_argument("--venvs", type=Path, default=Path(tempfile.gettempdir()) / "codectx-bench-venvs")
    return parser.parse_args(argv)


def reading_order(path: Path) -> list[tuple[str, int, int]]:
    """(name, 0-based line, column) of every function, method (`__init__` too) and class defined
    in `path`, top to bottom."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            line = node.lineno - 1
            found.append((node.name, line, lines[line].index(node.name) + 1))
    return sorted(found, key=lambda item: item[1])


def largest_module(source: Path) -> Path:
    return max(source.rglob("*.py"), key=lambda p: len(reading_order(p)))


class Reader:
    """Hovers as a reader does, recording when each complete answer showed."""

    def __init__(self, client: Client, path: Path) -> None:
        self.client, self.path = client, path
        self.rows: list[dict] = []
        self.pollers: list[asyncio.Task] = []

    async def markdown(self, line: int, column: int) -> str:
        hover = await self.client.lsp.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=self.path.as_uri()),
            position=types.Position(line, column)))
        return "" if hover is None else hover.contents.value

    async def hover(self, case: str, name: str, line: int, column: int) -> None:
        started = time.perf_counter()
        text = await self.markdown(line, column)
        row = {"case": case, "name": name, "reply_ms": 1000 * (time.perf_counter() - started), "answer_s": None}
        self.rows.append(row)
        if not text:
            row["answer_s"] = float("inf")  # no definition found: never an answer
        elif PENDING_LINE not in text:
            row["answer_s"] = time.perf_counter() - started
        else:
            self.pollers.append(asyncio.ensure_future(self.poll(row, started, line, column)))

    async def poll(self, row: dict, started: float, line: int, column: int) -> None:
        while time.perf_counter() - started < NEVER_S:
            await asyncio.sleep(POLL_S)
            if PENDING_LINE not in await self.markdown(line, column):
                row["answer_s"] = time.perf_counter() - started
                return
        row["answer_s"] = float("inf")


async def loading_card(args, repo: Path, path: Path, first: tuple[str, int, int], work: Path) -> float | None:
    """Milliseconds of a hover sent right after `initialize` (the model still loading), or None
    when the reply was not the loading card."""
    client = Client(repo, {"model": {"name": args.model}}, work / "loading.log")
    await client.lsp.start_io(sys.executable, "-m", "server.serve_cmd", "--log-file", str(client.log), cwd=str(ROOT))
    await client.lsp.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=repo.as_uri(), initialization_options=client.options))
    client.lsp.initialized(types.InitializedParams())
    client.open(path)
    started = time.perf_counter()
    text = await Reader(client, path).markdown(first[1], first[2])
    elapsed = 1000 * (time.perf_counter() - started)
    await client.close()
    return elapsed if LOADING_LINE in text else None


async def session(args, seed: int, repo: Path, path: Path, work: Path) -> list[dict]:
    client = Client(repo, {"model": {"name": args.model}, "memory": {"archiveEnabled": False}},
                    work / f"reading-{seed}.log")
    await client.start()
    await client.warm_event.wait()
    uri = client.open(path)
    reader, pauses = Reader(client, path), random.Random(seed)
    order = reading_order(path)[: args.hovers]
    for name, line, column in order:
        await asyncio.sleep(pauses.uniform(1.0, 3.0))
        await reader.hover("reading", name, line, column)
    name, line, column = order[len(order) // 2]
    at = types.Position(line + 1, 0)
    client.lsp.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=at, end=at), text="        # reviewed\n")]))
    await asyncio.sleep(pauses.uniform(1.0, 3.0))
    await reader.hover("after an edit", name, line, column)
    await asyncio.gather(*reader.pollers)
    state = await client.command("codectx.status")
    await client.close()
    for row in reader.rows:
        row["seed"] = seed
    return reader.rows, {"seed": seed, "hoverPrefetch": _plain(state["hoverPrefetch"]),
                         "outcomes": _plain(state["counters"]["outcomes"])}


def _plain(value):
    """A status field (pygls gives attribute objects) as plain JSON data."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items()}
    return value


def summary(rows: list[dict]) -> list[list]:
    """Shares per case over every session, then every session's own ("seed N")."""
    table = []
    seeds = sorted({r["seed"] for r in rows})
    groups = [(case, [r for r in rows if case == "all" or r["case"] == case])
              for case in ("reading", "after an edit", "all")]
    if len(seeds) > 1:
        groups += [(f"seed {seed}", [r for r in rows if r["seed"] == seed]) for seed in seeds]
    for case, picked in groups:
        shares = [100 * sum(r["answer_s"] <= limit for r in picked) / len(picked) for _, limit in BUCKETS]
        never = 100 * sum(r["answer_s"] == float("inf") for r in picked) / len(picked)
        table.append([case, len(picked), *shares, never])
    return table


async def main_async(args) -> dict:
    source = install_package(args.package, args.version, args.venvs)
    with tempfile.TemporaryDirectory(prefix="codectx-reading-") as tmp:
        work = Path(tmp)
        repo = work / args.package
        shutil.copytree(source, repo / source.name)
        path = largest_module(repo)
        card_ms = await loading_card(args, repo, path, reading_order(path)[0], work)
        rows, servers = [], []
        for seed in [int(s) for s in args.seeds.split(",")]:
            seed_rows, status = await session(args, seed, repo, path, work)
            rows += seed_rows
            servers.append(status)
            print(f"seed {seed}: {summary(seed_rows)[-1][2]:.0f}% within 100 ms", file=sys.stderr, flush=True)
    return {"machine": machine(), "package": f"{args.package}=={args.version}",
            "file": path.relative_to(repo).as_posix(), "loading_card_ms": card_ms, "rows": rows,
            "summary": summary(rows), "server": servers}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(main_async(args))
    headers = ["hovers", "n", *[f"answer {label} %" for label, _ in BUCKETS], "never %"]
    print(markdown_table(headers, result["summary"]))
    card = result["loading_card_ms"]
    print(f"\nhover while the model loads: {'not the loading card' if card is None else f'{card:.0f} ms'}"
          f" (goal < 100 ms); complete answers within 100 ms: {result['summary'][2][2]:.0f}% (goal >= 80%)")
    print(f"server at the end: {result['server']}")
    for row in result["rows"]:
        row["answer_s"] = None if row["answer_s"] == float("inf") else row["answer_s"]
    print(f"wrote {write_json('lsp-reading', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
