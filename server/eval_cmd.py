"""`codectx eval`: what approximation costs in answers, measured on generated tasks.

Runs needle retrieval, variable tracking and code questions over a fixture
repository at the given context lengths and seeds under several arms (dense / windowed attention x 16 / 8-bit KV), prints
a table and writes JSON with the counts of tasks actually run and each item
where an arm disagreed with the reference arm (the first one).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine.compute_options import ATTENTION_CHOICES, FORWARD_CHOICES, ComputeOptions

ARMS = {  # name -> (windowed, kv bits)
    "dense-16": (False, 16),
    "window-16": (True, 16),
    "dense-8": (False, 8),
    "window-8": (True, 8),
}


MAX_TOKENS = {"needle": 112, "variables": 40, "code": 24}
"""Enough for 15 codes, five variable names, one fact."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model name, path or hub id (default: smollm2-135m)")
    parser.add_argument("--lengths", default="6000", help="context lengths in tokens, comma-separated")
    parser.add_argument("--seeds", default="0", help="seeds, comma-separated")
    parser.add_argument("--tasks", default="needle,variables,code", help="of needle, variables, code")
    parser.add_argument("--arms", default="dense-16,window-16", help=f"first is the reference; of {list(ARMS)}")
    parser.add_argument("--window", default="1024,1024", help="G,W (defaults scaled for an 8k-context model)")
    parser.add_argument("--tail", type=int, default=256, help="dense tail before the question")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"answer length (default per task: {MAX_TOKENS})")
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--attention", default="auto", choices=ATTENTION_CHOICES, help="compute.attention")
    parser.add_argument("--forward", default="auto", choices=FORWARD_CHOICES, help="compute.forward")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="compute.compile off")
    parser.add_argument("--blas", default="auto", help="compute.blas: auto, off or a library path")
    parser.add_argument("--blas-threads", type=int, default=0, help="compute.blasThreads (0: usable cores, at most 8)")
    parser.add_argument("--out", default=None, help="JSON path (default: stdout table only)")


def fit_length(make, seed: int, tokens: int, count) -> Any:
    """The task `make(seed, n)` whose context is about `tokens` long (n scaled from a probe).

    Args:
        make: A task maker taking (seed, size units).
        seed: The task seed.
        tokens: Target context length in tokens.
        count: Tokens of a text under the model's tokenizer.
    """
    probe = 64
    per_unit = count(make(seed, probe).context) / probe
    return make(seed, max(1, int(tokens / per_unit)))


def write_json(path: Path, model_id: str, window: tuple[int, int], tail: int, arms: list[str],
               runs: list, summary: dict) -> None:
    """The run so far: settings, counts of tasks run, summary, every answer and its timing."""
    result = dict(model=model_id, window=list(window), tail=tail, arms=arms,
                  tasks_run=len(runs), summary=summary,
                  runs=[dict(kind=r.task.kind, seed=r.task.seed, tokens=r.context_tokens,
                             answers={k: v.answers for k, v in r.results.items()},
                             items={k: v.items for k, v in r.results.items()},
                             seconds={k: round(v.seconds, 1) for k, v in r.results.items()})
                        for r in runs])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))


def _arms(names: list[str], g: int, w: int, tail: int) -> list:
    from engine.eval.runner import Arm
    from engine.window import WindowPolicy

    return [Arm(n, WindowPolicy(enabled=ARMS[n][0], global_tokens=g, window_tokens=w, dense_tail=tail), ARMS[n][1])
            for n in names]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="codectx eval", description=__doc__.splitlines()[0])
    add_arguments(parser)
    a = parser.parse_args(argv)
    names = [n for n in a.arms.split(",") if n]
    if not names or any(n not in ARMS for n in names):
        parser.error(f"--arms must name some of {list(ARMS)}")
    try:  # before the model loads
        lengths, seeds = [int(x) for x in a.lengths.split(",")], [int(x) for x in a.seeds.split(",")]
        g, w = (int(x) for x in a.window.split(","))
    except ValueError:
        parser.error("--lengths and --seeds take integers, comma-separated, and --window two of them (G,W)")

    try:
        compute = ComputeOptions(attention=a.attention, forward=a.forward, compile=a.compile,
                                 blas=a.blas, blas_threads=a.blas_threads)
    except ValueError as err:
        parser.error(str(err))
    from engine import blas

    blas.preload(compute.blas, compute.blas_threads)  # before MLX is imported
    from engine.eval.code_task import code_task
    from engine.eval.runner import run_tasks, summarize, table
    from engine.eval.tasks import needle_task, variable_task
    from engine.loading import load_model

    loaded = load_model(a.model)
    arms = _arms(names, g, w, a.tail)
    makers = {"needle": needle_task, "variables": variable_task, "code": code_task}
    kinds = [k for k in a.tasks.split(",") if k]
    if any(k not in makers for k in kinds):
        parser.error(f"--tasks must name some of {list(makers)}")
    count = lambda text: len(loaded.tokenizer.encode(text))  # noqa: E731
    tasks = [fit_length(makers[kind], seed, length, count)
             for length in lengths
             for seed in seeds
             for kind in kinds]

    def report(runs: list) -> None:  # after every task, so a long run leaves its JSON as it goes
        if a.out:
            write_json(Path(a.out), loaded.model_id, (g, w), a.tail, names, runs, summarize(runs, names[0]))

    runs = run_tasks(loaded, tasks, arms, chunk=a.chunk, compute=compute, on_run=report,
                     max_tokens=lambda task: a.max_tokens or MAX_TOKENS[task.kind])
    summary = summarize(runs, names[0])
    print(table(summary, names[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
