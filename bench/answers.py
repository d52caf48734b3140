"""Benchmark of answers: accuracy, loops and latency of `codectx ask` on questions about a real package.

Target: ``itsdangerous==2.2.0`` from PyPI, installed into a venv this benchmark
creates once under ``$CODECTX_HOME/bench-venvs`` (``--cache``). Why it: small
(8 modules, ~1,200 lines, ~10k tokens of the default model's tokenizer, so the
6,000-token prefix holds about half of it and the rest is map or omitted:
exactly the case focus is for), pure Python, fully annotated (return types and
defaults to ask about), widely used (Flask's signing), stable API. The
repository asked about is its site-packages folder, copied to a temporary
folder (one copy per arm, so each arm's workspace state is its own).

Questions (at least 40 by default) are generated from the source with `ast` and
graded automatically: bench/answer_questions.py (kinds, accepted forms, the
tolerant matcher). Every arm runs on the default model through the server's core,
exactly as `codectx ask --repo` does (`start_backend`, the CLI's session with
`WorkspacePrompt`, `features.ask.ask` with the tool loop), greedy, one session
per arm, all arms in one run on one backend:

- ``focus-on``: settings ``focus.enabled = true`` (``focus.budgetTokens`` from ``--focus-budget``);
- ``focus-off``: ``focus.enabled = false``: the stable prefix and the question only;
- ``repo-map``: the peer layout an Aider-style repository map gives: the same
  workspace with ``map_share = 1.0`` (no file whole; the ranked signature map of
  every file that fits the budget) and focus off.

Per arm: accuracy (right / total), loops (finish reason ``repetition``: the
guard stopped them; and answers that ran to ``--max-tokens`` repeating
themselves, i.e. holding two copies of a period over at least 16 tokens: what
the guard let through), answers that ran to the limit at all, the lenient score
(an accepted form anywhere in the answer), TTFT (median; the first
question of an arm also prefills the arm's prefix) and time per answer. Prints a
table and writes ``bench/results/answers-<timestamp>.json`` (every answer, three
examples per arm).

    CODECTX_HOME=$(mktemp -d) python bench/answers.py [--questions 40] [--max-tokens 128]
        [--arms focus-on,focus-off,repo-map] [--package itsdangerous --version 2.2.0]
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
from bench.answer_questions import Question, fingerprint, generate, grade, install_package  # noqa: E402

ARMS = ("focus-on", "focus-off", "repo-map")
LOOP_REASONS = ("repetition", "length")
"""Finish reasons of answers that did not end by themselves."""
LOOSE_LOOP = (2, 16)
"""(copies, tokens) of the looser rule that finds the loops the guard let through."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=40, help="how many questions (default 40, the set's head)")
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens per answer (default 128)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}")
    parser.add_argument("--package", default="itsdangerous", help="PyPI package asked about")
    parser.add_argument("--version", default="2.2.0", help="its pinned version")
    parser.add_argument("--focus-budget", type=int, default=None, help="focus.budgetTokens (default: the setting's)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="folder for the package venvs (default $CODECTX_HOME/bench-venvs)")
    args = parser.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(args.arms) - set(ARMS))
    if unknown or not args.arms:
        parser.error(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    if args.questions < 1 or args.max_tokens < 1:
        parser.error("--questions and --max-tokens must be >= 1")
    return args


def has_focus_settings() -> bool:
    """Whether the settings tree has `focus` (focus segments landed in server/core/settings.py)."""
    from server.core.settings import Settings

    return any(f.name == "focus" for f in dataclasses.fields(Settings))


def arm_settings(base: Any, arm: str, focus_budget: int | None) -> Any:
    """The settings of one arm: `focus.enabled` on for focus-on, off otherwise (where the tree has it)."""
    if not has_focus_settings():
        return base
    focus = dataclasses.replace(base.focus, enabled=arm == "focus-on")
    if focus_budget is not None:
        focus = dataclasses.replace(focus, budget_tokens=focus_budget)
    return dataclasses.replace(base, focus=focus)


def open_session(settings: Any, backend: Any, repo: Path, question: str, max_tokens: int, arm: str) -> tuple:
    """A core session over `repo` built exactly as `codectx ask --repo` builds it, and its tools.

    The repo-map arm rebuilds the same workspace with the whole budget given to the
    signature map (`Workspace.map_share = 1.0`: no file whole, files by rank).
    """
    from server.ask_cmd import repo_session
    from server.context_cmd import progress_bar

    session, tools = repo_session(settings, backend, repo, question, max_tokens, progress_bar(sys.stderr))
    if arm == "repo-map":
        session.prompt.workspace.map_share = 1.0
        session.prompt.workspace.build()
    return session, tools


def layout_summary(session: Any) -> dict:
    """Kinds and tokens of the arm's stable prefix."""
    layout = session.prompt.workspace.layout
    kinds: dict[str, int] = {}
    for seg in layout.segments:
        kinds[str(seg.kind)] = kinds.get(str(seg.kind), 0) + 1
    return {"prefix_tokens": layout.tokens, "segments": kinds,
            "whole_files": [s.key for s in layout.segments if str(s.kind) in ("file", "hot")]}


async def run_arm(arm: str, settings: Any, backend: Any, source: Path, questions: list[Question],
                  max_tokens: int) -> dict:
    """Every question through `features.ask.ask` on one session; the arm's rows."""
    from engine.request import SamplingParams
    from server.core.features.ask import ask

    with tempfile.TemporaryDirectory(prefix=f"answers-{arm}-") as tmp:
        repo = Path(tmp) / source.name
        shutil.copytree(source, repo, ignore=shutil.ignore_patterns("__pycache__"))
        longest = max((q.text for q in questions), key=len)
        session, tools = await asyncio.to_thread(open_session, settings, backend, repo, longest, max_tokens, arm)
        rows = []
        for i, q in enumerate(questions):
            t0 = time.perf_counter()
            result = await ask(session, q.text, on_text=lambda _t: None, tools=tools, max_tokens=max_tokens,
                               sampling=SamplingParams(temperature=0.0))
            total = time.perf_counter() - t0
            right = grade(result.text, q)
            looping = result.finish_reason == "length" and loops_loosely(result.text, session.tokenizer)
            rows.append({"kind": q.kind, "question": q.text, "expected": list(q.accepted), "where": q.where,
                         "answer": result.text, "right": right, "right_anywhere": grade(result.text, q, anywhere=True),
                         "finish_reason": result.finish_reason, "length_in_a_loop": looping,
                         "ttft_s": result.metrics.get("ttft_s"), "total_s": total,
                         "prompt_tokens": result.metrics.get("prompt_tokens"),
                         "decode_tokens": result.metrics.get("decode_tokens"),
                         "tool_calls": len(result.tool_calls), "focus": _focused(result)})
            sys.stderr.write(f"[{arm} {i + 1}/{len(questions)}] {'right' if right else 'wrong'} "
                             f"{result.finish_reason} ttft {rows[-1]['ttft_s']:.2f}s total {total:.1f}s\n")
        summary = layout_summary(session)
    return {"arm": arm, "layout": summary, "answers": rows}


def loops_loosely(text: str, tokenizer: Any) -> bool:
    """True when `text` repeats itself by the looser rule `LOOSE_LOOP` anywhere (compared as the guard
    compares: by the tokenizer's `loop_keys`)."""
    from engine.loop_guard import LoopGuard, LoopRule
    from engine.request import Metrics

    copies, tokens = LOOSE_LOOP
    guard = LoopGuard(True, Metrics(), tokenizer.loop_keys, LoopRule(min_repeats=copies, min_tokens=tokens))
    return any(guard.observe(token) for token in tokenizer.encode(text))


def _focused(result: Any) -> dict | None:
    """What the ask focused and why (`Focus.as_dict()`), None when focus was off."""
    focus = getattr(result, "focus", None)
    return focus if isinstance(focus, dict) else None


def arm_row(result: dict) -> dict:
    """Accuracy, loops and times of one arm."""
    rows = result["answers"]
    ttfts = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    return {"arm": result["arm"], "right": sum(r["right"] for r in rows), "total": len(rows),
            "accuracy": sum(r["right"] for r in rows) / len(rows),
            "right_anywhere": sum(r["right_anywhere"] for r in rows),
            "repetition": sum(r["finish_reason"] == "repetition" for r in rows),
            "length": sum(r["finish_reason"] == "length" for r in rows),
            "length_in_a_loop": sum(bool(r.get("length_in_a_loop")) for r in rows),
            "loops": sum(r["finish_reason"] == "repetition" or bool(r.get("length_in_a_loop")) for r in rows),
            "ttft_median_s": statistics.median(ttfts) if ttfts else None,
            "ttft_first_s": ttfts[0] if ttfts else None,
            "answer_mean_s": statistics.fmean(r["total_s"] for r in rows),
            "arm_total_s": sum(r["total_s"] for r in rows),
            "prefix_tokens": result["layout"]["prefix_tokens"]}


async def run_all(args: argparse.Namespace, source: Path, questions: list[Question], notes: list[str],
                  on_arm: Callable[[list[dict]], None]) -> list[dict]:
    """Every arm on one backend; `on_arm` gets the results so far after each arm."""
    from server.core.backend import start_backend
    from server.core.settings import Settings

    base = Settings()
    arms = list(args.arms)
    if "focus-on" in arms and not has_focus_settings():
        arms.remove("focus-on")
        notes.append("focus-on not run: the settings tree has no `focus` yet (server/core/settings.py)")
        sys.stderr.write(notes[-1] + "\n")
    backend = await asyncio.to_thread(start_backend, base, progress=True)
    results: list[dict] = []
    try:
        for arm in arms:
            results.append(await run_arm(arm, arm_settings(base, arm, args.focus_budget), backend, source,
                                         questions, args.max_tokens))
            on_arm(results)
        return results
    finally:
        backend.close()


def print_table(table: list[dict], notes: list[str]) -> None:
    headers = ("arm", "right / total", "accuracy", "lenient", "loops (stopped + let through)", "ran to the limit",
               "TTFT median s",
               "TTFT first s", "s per answer", "prefix tok")
    sys.stdout.write(markdown_table(headers, [
        (t["arm"], f"{t['right']} / {t['total']}", f"{t['accuracy']:.0%}", f"{t['right_anywhere'] / t['total']:.0%}",
         f"{t['loops']} ({t['repetition']} + {t.get('length_in_a_loop', 0)})", t["length"],
         t["ttft_median_s"], t["ttft_first_s"],
         t["answer_mean_s"], t["prefix_tokens"]) for t in table]) + "\n")
    for note in notes:
        sys.stdout.write(f"note: {note}\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)
    from engine.paths import codectx_home

    cache = args.cache or codectx_home() / "bench-venvs"
    source = install_package(args.package, args.version, cache)
    every = generate(source, args.package)
    questions = every[:args.questions]
    notes: list[str] = []
    started = time.perf_counter()
    written: list[Path] = []

    def save(results: list[dict]) -> None:
        """The JSON after every arm (one file, rewritten), so an interrupted run keeps its finished arms."""
        payload = {"package": args.package, "version": args.version, "questions": len(questions),
                   "question_set": {"available": len(every), "fingerprint": fingerprint(questions)},
                   "max_tokens": args.max_tokens, "focus_settings": has_focus_settings(),
                   "focus_budget": args.focus_budget, "notes": notes, "wall_s": time.perf_counter() - started,
                   "machine": machine(), "arms": [arm_row(r) for r in results],
                   "examples": {r["arm"]: r["answers"][:3] for r in results},
                   "answers": {r["arm"]: r["answers"] for r in results},
                   "layouts": {r["arm"]: r["layout"] for r in results}}
        if not written:
            written.append(write_json("answers", payload))
        else:
            written[0].write_text(json.dumps({"utc": written[0].stem.split("-", 1)[1], **payload}, indent=2,
                                             default=str) + "\n", encoding="utf-8")

    results = asyncio.run(run_all(args, source, questions, notes, save))
    print_table([arm_row(r) for r in results], notes)
    sys.stdout.write(f"wrote {written[0] if written else 'nothing'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
