"""Benchmark of answers after an edit: the hot-tail prompt (stale copy in place + current text at
the end) against the exact prompt built with the edit in place.

An edit must not move what comes before it in the prompt (docs/context.md, *Segments*), so
after an edit the prompt holds the file twice: the stale copy in its place and the current
text in the hot tail. This measures what that costs answers. Target: ``itsdangerous==2.2.0``
(bench/answers.py says why), installed once under ``$CODECTX_HOME/bench-venvs``.

Edits and questions: bench/answer_edits.py builds single edits of the package's real source
with `ast` (renamed functions and classes, a caller whose callee was renamed, changed return
annotations, base classes and default values); each question's right answer is the NEW text
and its stale answer the OLD text. Only files that sit whole in the default layout and whose
edited copy fits the hot tail's share of the budget are edited (a larger file's edit folds
the tail: no duplicate to measure). Two arms per focus setting, one backend, greedy, the
default model, each session built exactly as `codectx ask --repo` builds it:

- ``hot-tail``: one session on the unedited copy; each edit goes in as the editor sends it
  (a real `DocumentStore` buffer: didOpen, then a didChange with the changed range; the
  prompt marks the path dirty as the language server's `didChange` does), the question is
  asked, and a second didChange restores the text (the hot segment leaves, the prefix stays
  warm). Every answer records that the prompt really held both copies (`duplicate`);
- ``in-place``: per edit, a fresh copy of the package with the edit on disk and a fresh
  session: the prompt a fresh build of the edited repository gives.

Per arm: accuracy, stale answers (an old form where the grader looks, no new one; also
counted anywhere in the answer), loops (finish reason ``repetition`` or ``length``), TTFT
(median) and time per answer. Both arms start from the unedited prefix prefilled once.
Prints a table and writes ``bench/results/answers_edit-<timestamp>.json``.

    CODECTX_HOME=$(mktemp -d) python bench/answers_edit.py [--questions 20] [--max-tokens 64]
        [--focus off,on] [--arms hot-tail,in-place]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import machine, markdown_table, write_json  # noqa: E402
from bench.answer_edits import EditQuestion, fingerprint, generate_edits, is_stale, mentions_old, states  # noqa: E402
from bench.answer_questions import grade, install_package  # noqa: E402
from bench.answers import LOOP_REASONS, open_session  # noqa: E402

ARMS = ("hot-tail", "in-place")
HOT_MARGIN_TOKENS = 64  # an edit changes a file's tokens a little; keep its hot copy inside the share


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=20, help="how many questions (default 20, the set's head)")
    parser.add_argument("--max-tokens", type=int, default=64, help="most tokens per answer (default 64)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}")
    parser.add_argument("--focus", default="off,on", help="focus.enabled values to run both arms with")
    parser.add_argument("--package", default="itsdangerous", help="PyPI package asked about")
    parser.add_argument("--version", default="2.2.0", help="its pinned version")
    parser.add_argument("--cache", type=Path, default=None,
                        help="folder for the package venvs (default $CODECTX_HOME/bench-venvs)")
    parser.add_argument("--regrade", type=Path, default=None,
                        help="grade the answers of an earlier run's JSON again and print its table (no model)")
    args = parser.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    args.focus = [f.strip() for f in args.focus.split(",") if f.strip()]
    if sorted(set(args.arms) - set(ARMS)) or not args.arms:
        parser.error(f"--arms: choose from {', '.join(ARMS)}")
    if sorted(set(args.focus) - {"on", "off"}) or not args.focus:
        parser.error("--focus: a comma-separated list of on, off")
    if args.questions < 1 or args.max_tokens < 1:
        parser.error("--questions and --max-tokens must be >= 1")
    return args


class EditorBuffers:
    """The editor's side of an edit: a real `DocumentStore` fed didOpen / didChange as a client sends them."""

    def __init__(self, session: Any) -> None:
        from lsprotocol import types
        from server.lsp.documents import DocumentStore

        self.types, self.session = types, session
        self.store = DocumentStore(types.PositionEncodingKind.Utf16)
        session.base.documents = self.store  # the prompt reads open buffers through the session
        self.version = 0

    def open(self, path: Path, text: str) -> None:
        self.store.open(self.types.TextDocumentItem(uri=path.as_uri(), language_id="python", version=0, text=text))
        self.session.prompt.mark_dirty(path)

    def change(self, path: Path, new: str) -> None:
        """One didChange replacing the range between the texts' common prefix and suffix."""
        t = self.types
        old = self.store.by_path(path).text
        head = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        tail = 0
        while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
            tail += 1
        rng = t.Range(start=_position(old, head), end=_position(old, len(old) - tail))
        self.version += 1
        self.store.change(t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=path.as_uri(), version=self.version),
            content_changes=[t.TextDocumentContentChangePartial(range=rng, text=new[head:len(new) - tail])]))
        self.session.prompt.mark_dirty(path)


def _position(text: str, index: int) -> Any:
    """The LSP position (UTF-16 columns) of character `index` in `text`."""
    from lsprotocol import types

    line_start = text.rfind("\n", 0, index) + 1
    column = len(text[line_start:index].encode("utf-16-le")) // 2
    return types.Position(line=text.count("\n", 0, index), character=column)


def prompt_copies(session: Any, rel: str) -> dict:
    """Whether `rel` is in place and in the hot tail of the session's prefix, and the hot copy's tokens."""
    segments = session.prompt.prefix_segments()
    placed = any(str(s.kind) == "file" and s.key == rel for s in segments)
    hot = [len(s.token_ids) for s in segments if str(s.kind) == "hot" and s.key == rel]
    return {"in_place": placed, "hot_tokens": hot[0] if hot else 0, "duplicate": placed and bool(hot)}


def editable_files(session: Any) -> list[str]:
    """Python files whole in the prefix whose edited copy fits the hot tail's share of the budget."""
    ws = session.prompt.workspace
    room = int(ws.budget * ws.hot_share) if ws.budget is not None else 0
    return [s.key for s in ws.layout.segments
            if str(s.kind) == "file" and s.key.endswith(".py") and len(s.token_ids) + HOT_MARGIN_TOKENS <= room]


async def answer_row(session: Any, tools: Any, edit: EditQuestion, max_tokens: int) -> dict:
    """One question through `features.ask.ask`, graded (right / stale), with its metrics."""
    from engine.request import SamplingParams
    from server.core.features.ask import ask

    t0 = time.perf_counter()
    result = await ask(session, edit.question.text, on_text=lambda _t: None, tools=tools, max_tokens=max_tokens,
                       sampling=SamplingParams(temperature=0.0))
    q, m = edit.question, result.metrics
    return {"kind": q.kind, "question": q.text, "edit": edit.summary, "path": edit.path,
            "expected": list(q.accepted), "stale_forms": list(edit.stale), "answer": result.text,
            **grades(result.text, edit),
            "finish_reason": result.finish_reason, "ttft_s": m.get("ttft_s"), "total_s": time.perf_counter() - t0,
            "prompt_tokens": m.get("prompt_tokens"), "cached_tokens": m.get("cached_tokens"),
            "decode_tokens": m.get("decode_tokens"), "tool_calls": len(result.tool_calls),
            "focus": result.focus if isinstance(result.focus, dict) else None}


def grades(answer: str, edit: EditQuestion) -> dict:
    """Right (bench/answers.py's grader, first sentence / anywhere), strict (the stated answer is new),
    stale (the stated answer is old) and old forms in the first sentence without a new one."""
    q = edit.question
    return {"right": grade(answer, q), "right_anywhere": grade(answer, q, anywhere=True),
            "right_strict": states(answer, q.accepted), "stale": is_stale(answer, edit),
            "mentions_old": mentions_old(answer, edit)}


def _log(arm: str, i: int, n: int, row: dict) -> None:
    verdict = "right" if row["right"] else "STALE" if row["stale"] else "wrong"
    sys.stderr.write(f"[{arm} {i + 1}/{n}] {verdict} {row['finish_reason']} ttft {row['ttft_s']:.2f}s "
                     f"total {row['total_s']:.1f}s  {row['edit']}\n")


async def run_hot_tail(arm: str, session: Any, tools: Any, edits: list[EditQuestion], max_tokens: int) -> dict:
    """Every edit through the editor's buffer on one session over the unedited copy, asked, then undone."""
    buffers = EditorBuffers(session)
    root = session.prompt.root
    opened: set[str] = set()
    rows = []
    for i, edit in enumerate(edits):
        path = root / edit.path
        original = path.read_text(encoding="utf-8")
        if edit.path not in opened:
            buffers.open(path, original)
            opened.add(edit.path)
        buffers.change(path, edit.new_text)
        copies = prompt_copies(session, edit.path)
        row = await answer_row(session, tools, edit, max_tokens)
        rows.append({**row, **copies})
        buffers.change(path, original)
        if prompt_copies(session, edit.path)["hot_tokens"]:
            raise RuntimeError(f"{edit.path}: the hot copy stayed after the edit was undone")
        _log(arm, i, len(edits), rows[-1])
    return {"arm": arm, "answers": rows}


async def run_in_place(arm: str, settings: Any, backend: Any, source: Path, edits: list[EditQuestion],
                       budget_question: str, max_tokens: int) -> dict:
    """Per edit: a fresh copy with the edit on disk, a fresh session (the exact in-place prompt)."""
    rows = []
    for i, edit in enumerate(edits):
        with tempfile.TemporaryDirectory(prefix="answers-edit-") as tmp:
            repo = Path(tmp) / source.name
            shutil.copytree(source, repo, ignore=shutil.ignore_patterns("__pycache__"))
            (repo / edit.path).write_text(edit.new_text, encoding="utf-8")
            session, tools = await asyncio.to_thread(open_session, settings, backend, repo, budget_question,
                                                     max_tokens, arm)
            copies = prompt_copies(session, edit.path)
            rows.append({**await answer_row(session, tools, edit, max_tokens), **copies})
        _log(arm, i, len(edits), rows[-1])
    return {"arm": arm, "answers": rows}


def focus_settings(base: Any, focus: str) -> Any:
    return dataclasses.replace(base, focus=dataclasses.replace(base.focus, enabled=focus == "on"))


async def warm(session: Any) -> float:
    """Prefills the session's stable prefix (the unedited repository) once; returns the seconds."""
    from engine.request import Priority

    t0 = time.perf_counter()
    await session.generate(session.prompt.prefix_segments(), max_tokens=0, priority=Priority.BACKGROUND)
    return time.perf_counter() - t0


async def run_all(args: argparse.Namespace, source: Path, info: dict,
                  on_arm: Callable[[list[dict]], None]) -> list[dict]:
    """Both arms for every focus setting on one backend; `on_arm` gets the results after each arm."""
    from server.core.backend import start_backend
    from server.core.settings import Settings

    base = Settings()
    backend = await asyncio.to_thread(start_backend, base, progress=True)
    results: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="answers-edit-hot-") as tmp:
            repo = Path(tmp) / source.name
            shutil.copytree(source, repo, ignore=shutil.ignore_patterns("__pycache__"))
            files = editable_files((await asyncio.to_thread(open_session, base, backend, repo, "?",
                                                            args.max_tokens, "hot-tail"))[0])
            every = generate_edits(source, args.package, files)
            edits = every[:args.questions]
            longest = max((e.question.text for e in edits), key=len)
            info.update(files=files, available=len(every), edits=edits)
            for focus in args.focus:
                settings = focus_settings(base, focus)
                session, tools = await asyncio.to_thread(open_session, settings, backend, repo, longest,
                                                         args.max_tokens, "hot-tail")
                info.setdefault("warm_s", {})[focus] = await warm(session)
                info["prefix_tokens"] = session.prompt.workspace.layout.tokens
                for arm in args.arms:
                    name = f"{arm} focus-{focus}"
                    if arm == "hot-tail":
                        result = await run_hot_tail(name, session, tools, edits, args.max_tokens)
                    else:
                        result = await run_in_place(name, settings, backend, source, edits, longest, args.max_tokens)
                    results.append(dict(result, focus=focus))
                    on_arm(results)
        return results
    finally:
        backend.close()


def arm_row(result: dict, peer: dict | None) -> dict:
    """Accuracy, stale answers, loops and times of one arm; against `peer` (in-place, same focus): the
    accuracy ratio and the stale answers it did not give to the same question."""
    rows = result["answers"]
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    right = sum(r["right"] for r in rows)
    row = {"arm": result["arm"], "focus": result["focus"], "right": right, "total": len(rows),
           "accuracy": right / len(rows), "right_anywhere": sum(r["right_anywhere"] for r in rows),
           "right_strict": sum(r["right_strict"] for r in rows), "stale": sum(r["stale"] for r in rows),
           "mentions_old": sum(r["mentions_old"] for r in rows),
           "duplicates": sum(r["duplicate"] for r in rows),
           "loops": sum(r["finish_reason"] in LOOP_REASONS for r in rows),
           "ttft_median_s": statistics.median(ttfts) if ttfts else None,
           "answer_mean_s": statistics.fmean(r["total_s"] for r in rows),
           "arm_total_s": sum(r["total_s"] for r in rows)}
    if peer is None or peer is result:
        row["vs_in_place"] = row["stale_only_here"] = None
        return row
    theirs = {r["question"]: r for r in peer["answers"]}
    peer_right = sum(r["right"] for r in peer["answers"])
    row["vs_in_place"] = right / peer_right if peer_right else None
    row["stale_only_here"] = sum(r["stale"] and not theirs[r["question"]]["stale"] for r in rows)
    return row


def summary(results: list[dict]) -> list[dict]:
    """One row per arm; hot-tail arms against the in-place arm of the same focus setting."""
    peers = {r["focus"]: r for r in results if r["arm"].startswith("in-place")}
    return [arm_row(r, peers.get(r["focus"])) for r in results]


def print_table(table: list[dict]) -> None:
    headers = ("arm", "right / total", "accuracy", "vs in-place", "strict", "lenient", "stale answers",
               "stale, not in-place", "old form in 1st sentence", "both copies", "loops", "TTFT median s",
               "s per answer")
    sys.stdout.write(markdown_table(headers, [
        (t["arm"], f"{t['right']} / {t['total']}", f"{t['accuracy']:.0%}",
         f"{t['vs_in_place']:.0%}" if t["vs_in_place"] is not None else None,
         f"{t['right_strict']} / {t['total']}", f"{t['right_anywhere']} / {t['total']}", t["stale"],
         t["stale_only_here"], t["mentions_old"],
         f"{t['duplicates']} / {t['total']}", t["loops"], t["ttft_median_s"], t["answer_mean_s"])
        for t in table]) + "\n")


def regrade(path: Path) -> list[dict]:
    """The results of an earlier run (its JSON) with every answer graded again by this file's grader."""
    from bench.answer_questions import Question

    data = json.loads(path.read_text(encoding="utf-8"))
    results = []
    for arm, rows in data["answers"].items():
        for row in rows:
            question = Question(row["kind"], row["question"], tuple(row["expected"]), row["path"])
            row.update(grades(row["answer"], EditQuestion(question, tuple(row["stale_forms"]), row["path"],
                                                          row["edit"], "")))
        results.append({"arm": arm, "focus": arm.rsplit("focus-", 1)[-1], "answers": rows})
    return results


def source_state() -> dict:
    """The commit the run used and the files that differed from it (others' work in progress included)."""
    import subprocess

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "changed": git("status", "--short").splitlines()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.regrade is not None:
        print_table(summary(regrade(args.regrade)))
        return 0
    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)
    from engine.paths import codectx_home

    source = install_package(args.package, args.version, args.cache or codectx_home() / "bench-venvs")
    info: dict = {"source": source_state()}
    started = time.perf_counter()
    written: list[Path] = []

    def save(results: list[dict]) -> None:
        """The JSON after every arm (one file, rewritten), so an interrupted run keeps its finished arms."""
        edits = info["edits"]
        payload = {"package": args.package, "version": args.version, "questions": len(edits),
                   "question_set": {"available": info["available"], "fingerprint": fingerprint(edits),
                                    "files": info["files"]},
                   "max_tokens": args.max_tokens, "prefix_tokens": info.get("prefix_tokens"),
                   "warm_s": info.get("warm_s"), "wall_s": time.perf_counter() - started, "machine": machine(),
                   "source": info.setdefault("source", source_state()),
                   "arms": summary(results), "answers": {r["arm"]: r["answers"] for r in results}}
        if not written:
            written.append(write_json("answers_edit", payload))
        else:
            written[0].write_text(json.dumps({"utc": written[0].stem.split("-", 1)[1], **payload}, indent=2,
                                             default=str) + "\n", encoding="utf-8")

    results = asyncio.run(run_all(args, source, info, save))
    print_table(summary(results))
    sys.stdout.write(f"wrote {written[0] if written else 'nothing'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
