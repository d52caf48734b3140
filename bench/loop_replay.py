"""Replay of loop-guard rules over stored answers and real source: what each rule would stop, and what it would cut.

The guard only ever ends a generation, so the tokens before the point where a
rule fires are the same under every rule: a rule can be judged on text already
generated. This benchmark re-tokenizes (the default model's tokenizer) and
replays, for each rule:

- the answers stored by ``bench/answers.py`` and ``bench/answers_edit.py``
  (``--answers``, every answer of every arm), counted by how they ended:
  ``stop`` answers ended by themselves (a rule firing there cuts a finished
  answer), ``length`` ran to the limit (firing there saves tokens),
  ``repetition`` were stopped by the guard of their run (a rule should fire
  again there, at the text's end);
- texts given with ``--text`` (an answer saved from ``codectx ask``, counted
  as ``length``);
- each ``--text`` again as a remote engine streams it: fed to `TextLoopGuard` in
  pieces of 1, 3 and 7 characters, with the tokens it had checked when it fired
  (the guard over the whole text's tokens fires at the same token) and its time
  a piece;
- a corpus of real code and prose (``--corpus``: this repository's sources,
  tests and docs, and any folder given), cut into chunks of ``--chunk`` tokens:
  long legitimate output, where a rule should not fire. Chunks the rule fires
  on but the shipped id rule did not are listed.

Rules: ``ids/32`` compares token ids with two copies from 32 tokens (the rule
before keys); ``keys/N`` compares `LoopKeys` with two copies from N keys
(``keys/24`` is `engine.loop_guard`'s default). Re-tokenized text can split
differently from the generated tokens, so counts are close, not exact.
Prints a table and writes ``bench/results/loop_replay-<timestamp>.json`` (every firing answer and chunk).

    python bench/loop_replay.py [--answers 'bench/results/answers*.json'] [--text FILE ...]
        [--corpus DIR ...] [--chunk 512] [--long 16,20,24,32]

The headline run (docs/benchmarks.md, *Loop guard*): the README's question answered at d55477f, and the
VS Code client's TypeScript dependencies and pygls as more code:

    python bench/loop_replay.py --text bench/results/ask-readme-d55477f.txt \
        --corpus editors/vscode/node_modules --corpus .venv/lib/python3.11/site-packages/pygls
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import machine, markdown_table, write_json  # noqa: E402
from engine.loop_guard import LoopGuard, LoopKeys, LoopRule, TextLoopGuard  # noqa: E402
from engine.request import Metrics  # noqa: E402

SOURCE_GLOBS = ("engine/**/*.py", "server/**/*.py", "context/**/*.py", "tests/**/*.py", "bench/*.py",
                "docs/*.md", "editors/**/*.ts", "editors/**/*.lua")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", default="bench/results/answers*.json", help="glob of stored answer runs")
    ap.add_argument("--text", action="append", default=[], help="a saved answer (plain text), counted as length")
    ap.add_argument("--corpus", action="append", default=[], help="a folder of code or prose besides this repo")
    ap.add_argument("--chunk", type=int, default=512, help="corpus chunk in tokens (an answer's length)")
    ap.add_argument("--long", default="16,20,24,32", help="key rules' two-copy periods to compare")
    return ap.parse_args(argv)


def fire_index(ids: Iterable[int], keys: LoopKeys | None, rule: LoopRule) -> int | None:
    """Index of the token at which the engine's guard (`LoopGuard`, comparing `keys` or, None, the ids)
    fires under `rule`; None when it never does."""
    guard = LoopGuard(True, Metrics(), keys, rule)
    return next((i for i, token in enumerate(ids) if guard.observe(token)), None)


def stored_answers(pattern: str) -> list[dict]:
    """Every answer of every arm of the runs `pattern` matches: {source, arm, finish, text}."""
    found = []
    for path in sorted(glob.glob(pattern)):
        run = json.loads(Path(path).read_text(encoding="utf-8"))
        for arm, rows in run.get("answers", {}).items():
            found += [{"source": Path(path).name, "arm": arm, "finish": row["finish_reason"],
                       "text": row["answer"]} for row in rows]
    return found


def corpus_chunks(folders: list[Path], encode: Callable[[str], list[int]], chunk: int) -> list[dict]:
    """This repository's code and docs plus `folders`, tokenized and cut into `chunk`-token pieces."""
    files = sorted({p for g in SOURCE_GLOBS for p in ROOT.glob(g) if "node_modules" not in p.parts})
    files += sorted(p for folder in folders for p in folder.rglob("*") if p.suffix in (".py", ".md", ".ts"))
    chunks = []
    for path in files:
        try:
            ids = encode(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        chunks += [{"source": f"{name}:{start}", "ids": ids[start:start + chunk]}
                   for start in range(0, len(ids), chunk)]
    return chunks


def rules(longs: list[int]) -> dict[str, tuple[bool, LoopRule]]:
    """Name -> (compares keys, rule)."""
    named = {"ids/32": (False, LoopRule(long_period=32))}
    named.update({f"keys/{n}": (True, LoopRule(long_period=n)) for n in longs})
    return named


def replay(texts: list[dict], chunks: list[dict], named: dict[str, tuple[bool, LoopRule]],
           encode: Callable[[str], list[int]], keys: LoopKeys) -> dict[str, dict]:
    """Per rule: fired / total per finish reason, corpus chunks fired, and those the id rule did not fire on."""
    for text in texts:
        text["ids"] = encode(text["text"])
    report: dict[str, dict] = {}
    for name, (by_keys, rule) in named.items():
        counts: collections.Counter = collections.Counter()
        fired_texts = []
        for text in texts:
            at = fire_index(text["ids"], keys if by_keys else None, rule)
            counts[(text["finish"], at is not None)] += 1
            if at is not None and text["finish"] != "repetition":
                fired_texts.append({"source": text["source"], "arm": text["arm"], "finish": text["finish"],
                                    "at": at, "of": len(text["ids"])})
        chunk_fires = [c["source"] for c in chunks if fire_index(c["ids"], keys if by_keys else None, rule) is not None]
        report[name] = {
            "answers": {finish: {"fired": counts[(finish, True)],
                                 "total": counts[(finish, True)] + counts[(finish, False)]}
                        for finish in sorted({f for f, _ in counts})},
            "fired_not_by_the_guard": fired_texts, "corpus_fired": chunk_fires}
    baseline = set(report["ids/32"]["corpus_fired"])
    for entry in report.values():
        entry["corpus_fired_new"] = [c for c in entry["corpus_fired"] if c not in baseline]
    return report


def streamed(texts: list[dict], tokenizer: Any, sizes: tuple[int, ...] = (1, 3, 7)) -> list[dict]:
    """Each text fed to `TextLoopGuard` in pieces of `sizes` characters: where it fired, the tokens it had
    checked then (beside the token at which the guard over the whole text fires) and its time a piece."""
    rows = []
    for text in texts:
        whole = fire_index(tokenizer.encode(text["text"]), tokenizer.loop_keys, LoopRule())
        for size in sizes:
            guard = TextLoopGuard(LoopGuard(True, Metrics(), tokenizer.loop_keys), tokenizer.encode,
                                  tokenizer.decode)
            pieces = [text["text"][i:i + size] for i in range(0, len(text["text"]), size)]
            started = time.perf_counter()
            fed = next((i + 1 for i, piece in enumerate(pieces) if guard.feed(piece)), len(pieces))
            seconds = time.perf_counter() - started
            rows.append({"source": text["source"], "piece_chars": size, "fired": guard.guard.fired,
                         "chars_read": len("".join(pieces[:fed])), "chars": len(text["text"]),
                         "tokens_checked": guard.tokens, "us_per_piece": seconds / fed * 1e6,
                         "whole_text_fires_at_token": None if whole is None else whole + 1})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from engine.loading import load_tokenizer

    tokenizer = load_tokenizer()[0]
    texts = stored_answers(args.answers)
    texts += [{"source": Path(p).name, "arm": "text", "finish": "length",
               "text": Path(p).read_text(encoding="utf-8")} for p in args.text]
    if not texts:
        sys.exit(f"no answers matched {args.answers!r} and no --text given")
    chunks = corpus_chunks([Path(c) for c in args.corpus], tokenizer.encode, args.chunk)
    named = rules([int(n) for n in args.long.split(",")])
    started = time.perf_counter()
    report = replay(texts, chunks, named, tokenizer.encode, tokenizer.loop_keys)
    replay_s = time.perf_counter() - started
    finishes = sorted({t["finish"] for t in texts})
    rows = [[name] + [f"{entry['answers'].get(f, {}).get('fired', 0)} / {entry['answers'].get(f, {}).get('total', 0)}"
                      for f in finishes]
            + [f"{len(entry['corpus_fired'])} / {len(chunks)}", len(entry["corpus_fired_new"])]
            for name, entry in report.items()]
    print(markdown_table(["rule"] + [f"{f} answers fired" for f in finishes]
                         + ["corpus chunks fired", "corpus chunks new vs ids/32"], rows))
    stream_rows = streamed([t for t in texts if t["arm"] == "text"], tokenizer)
    if stream_rows:
        print(markdown_table(["text", "piece chars", "fired", "chars read", "tokens checked",
                              "whole text fires at token", "µs a piece"],
                             [[r["source"], r["piece_chars"], r["fired"], f"{r['chars_read']} / {r['chars']}",
                               r["tokens_checked"], r["whole_text_fires_at_token"], f"{r['us_per_piece']:.1f}"]
                              for r in stream_rows]))
    for name, entry in report.items():
        for text in entry["fired_not_by_the_guard"]:
            print(f"{name}: {text['finish']} answer {text['source']} [{text['arm']}] "
                  f"fires at {text['at']} of {text['of']}")
        for source in entry["corpus_fired_new"][:5]:
            print(f"{name}: corpus chunk {source} fires (ids/32 does not)")
    out = write_json("loop_replay", {"machine": machine(), "answers_glob": args.answers, "texts": args.text,
                                     "corpus": args.corpus, "answers": len(texts), "corpus_chunks": len(chunks),
                                     "chunk": args.chunk, "replay_s": replay_s, "rules": report,
                                     "streamed": stream_rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
