"""`codectx eval`: what approximation costs in answers, measured on generated tasks.

Runs needle retrieval and variable tracking at the given context lengths and
seeds under several arms (dense / windowed attention x 16 / 8-bit KV), prints
a table and writes JSON with the counts of tasks actually run and each item
where an arm disagreed with the reference arm (the first one).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ARMS = {  # name -> (windowed, kv bits)
    "dense-16": (False, 16),
    "window-16": (True, 16),
    "dense-8": (False, 8),
    "window-8": (True, 8),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model name, path or hub id (default: smollm2-135m)")
    parser.add_argument("--lengths", default="6000", help="context lengths in tokens, comma-separated")
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated")
    parser.add_argument("--tasks", default="needle,variables")
    parser.add_argument("--arms", default="dense-16,window-16", help=f"first is the reference; of {list(ARMS)}")
    parser.add_argument("--window", default="1024,1024", help="G,W (defaults scaled for an 8k-context model)")
    parser.add_argument("--tail", type=int, default=256, help="dense tail before the question")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--out", default=None, help="JSON path (default: stdout table only)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="codectx eval", description=__doc__.splitlines()[0])
    add_arguments(parser)
    a = parser.parse_args(argv)
    names = [n for n in a.arms.split(",") if n]
    if not names or any(n not in ARMS for n in names):
        parser.error(f"--arms must name some of {list(ARMS)}")

    from engine.eval.runner import Arm, run_tasks, summarize, table
    from engine.eval.tasks import filler, needle_task, variable_task
    from engine.loading import load_model
    from engine.window import WindowPolicy

    loaded = load_model(a.model)
    g, w = (int(x) for x in a.window.split(","))
    arms = [Arm(n, WindowPolicy(enabled=ARMS[n][0], global_tokens=g, window_tokens=w, dense_tail=a.tail),
                ARMS[n][1]) for n in names]
    sample = " ".join(filler(random.Random(0), 200))
    per_sentence = len(loaded.tokenizer.encode(sample)) / 200
    makers = {"needle": needle_task, "variables": variable_task}
    tasks = [makers[kind](seed, int(length / per_sentence))
             for length in (int(x) for x in a.lengths.split(","))
             for seed in (int(x) for x in a.seeds.split(","))
             for kind in a.tasks.split(",")]
    runs = run_tasks(loaded.model, loaded.tokenizer, tasks, arms, chunk=a.chunk, max_tokens=a.max_tokens)
    summary = summarize(runs, names[0])
    print(table(summary, names[0]))
    if a.out:
        result = dict(model=loaded.model_id, window=[g, w], tail=a.tail, arms=names,
                      tasks_run=len(runs), summary=summary,
                      runs=[dict(kind=r.task.kind, seed=r.task.seed, tokens=r.context_tokens,
                                 answers={k: v.answers for k, v in r.results.items()},
                                 seconds={k: round(v.seconds, 1) for k, v in r.results.items()})
                            for r in runs])
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
