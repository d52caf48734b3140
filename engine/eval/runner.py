"""Run fidelity tasks under several arms (attention policy x KV bits) and compare them.

Each arm is an `Engine` on the same loaded model, built with the arm's window
policy and KV bits. Every question is one request `[context][question]`: the
context is a stable (file) segment, windowed up to its dense tail when the
arm's policy is enabled, and the question is prefilled densely after it and
answered greedily. The engine's checkpoints restore the context for every
question after the first, exactly as a trim back to its end would. Scores are
per item (code or chain); paired agreement compares each arm's answers with
the reference arm's.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from engine.compute_options import ComputeOptions
from engine.errors import RequestCancelled
from engine.eval.tasks import Task, score
from engine.request import PromptSegment, Request, TokenEvent
from engine.window import WindowPolicy

logger = logging.getLogger(__name__)

_SPLIT = "\x00QUESTION\x00"


@dataclass(frozen=True)
class Arm:
    """One configuration under test."""

    name: str
    policy: WindowPolicy
    kv_bits: int = 16


@dataclass
class ArmResult:
    """Answers and per-item scores of one arm on one task."""

    arm: str
    answers: list[str]
    items: list[tuple[str, bool]]
    seconds: float


@dataclass
class TaskRun:
    """One task under every arm."""

    task: Task
    context_tokens: int
    results: dict[str, ArmResult] = field(default_factory=dict)


def template_parts(tokenizer: Any) -> tuple[str, str]:
    """Chat template text before and after a user message's question."""
    rendered = tokenizer.render_chat([{"role": "user", "content": _SPLIT}], add_generation_prompt=True)
    head, _, tail = rendered.partition(_SPLIT)
    return head, tail


def answer_task(engine: Any, task: Task, *, max_tokens: int = 96) -> tuple[list[str], int]:
    """Greedy answers to every question of `task` from `engine`, and the context's token count."""
    tokenizer = engine.tokenizer
    head, tail = template_parts(tokenizer)
    context = PromptSegment("file", "context", tuple(tokenizer.encode(head + task.context + "\n\n")))
    answers = []
    for question in task.questions:
        asked = PromptSegment("question", "question", tuple(tokenizer.encode(question.text + tail)))
        ids = _generated_ids(engine, Request(segments=(context, asked), max_tokens=max_tokens))
        answers.append(tokenizer.decode(ids))
    return answers, len(context.token_ids)


def _generated_ids(engine: Any, request: Request) -> list[int]:
    handle = engine.submit(request)
    ids = [t for event in handle if isinstance(event, TokenEvent) for t in event.token_ids]
    done = handle.result()
    if done.finish_reason == "error":
        raise done.error
    if done.finish_reason == "cancelled":
        raise RequestCancelled(request.request_id)
    return ids


def run_tasks(loaded: Any, tasks: Sequence[Task], arms: Sequence[Arm], *, chunk: int = 256,
              max_tokens: int | Callable[[Task], int] = 96, compute: ComputeOptions = ComputeOptions(),
              on_run: Callable[[list[TaskRun]], None] | None = None) -> list[TaskRun]:
    """Every task under every arm, one `Engine` per arm (closed at the end).

    Args:
        loaded: The model, as `engine.loading.load_model` returns it.
        tasks: What to ask.
        arms: The configurations; the first is usually the reference.
        chunk: The engines' prefill chunk.
        max_tokens: Answer length, or a function of the task giving it.
        compute: The engines' compute options.
        on_run: Called with the runs so far after every task (a long run reports as it goes).
    """
    from engine.engine import Engine

    engines = {arm.name: Engine(loaded, kv_bits=arm.kv_bits, prefill_chunk=chunk, window=arm.policy,
                                compute=compute) for arm in arms}
    runs = []
    try:
        for task in tasks:
            run = None
            for arm in arms:
                tic = time.perf_counter()
                limit = max_tokens(task) if callable(max_tokens) else max_tokens
                answers, n_ctx = answer_task(engines[arm.name], task, max_tokens=limit)
                run = run or TaskRun(task, n_ctx)
                result = ArmResult(arm.name, answers, score(task, answers), time.perf_counter() - tic)
                run.results[arm.name] = result
                logger.info("%s seed %d (%d tokens) %s: %d/%d", task.kind, task.seed, n_ctx, arm.name,
                            sum(ok for _, ok in result.items), len(result.items))
            runs.append(run)
            if on_run is not None:
                on_run(runs)
    finally:
        for engine in engines.values():
            engine.close()
    return runs


def summarize(runs: Sequence[TaskRun], reference: str) -> dict:
    """Counts per (kind, arm): items right, agreement with `reference`, identical answers."""
    out: dict[str, dict[str, dict]] = {}
    for run in runs:
        ref = run.results[reference]
        for name, res in run.results.items():
            row = out.setdefault(run.task.kind, {}).setdefault(
                name, dict(tasks=0, items=0, right=0, same_as_ref=0, answers=0, identical=0, failures=[]))
            row["tasks"] += 1
            for (item, ok), (_, ref_ok) in zip(res.items, ref.items):
                row["items"] += 1
                row["right"] += ok
                row["same_as_ref"] += ok == ref_ok
                if ok != ref_ok:
                    row["failures"].append(dict(seed=run.task.seed, tokens=run.context_tokens,
                                                item=item, ref=ref_ok, this=ok))
            row["answers"] += len(res.answers)
            row["identical"] += sum(a == b for a, b in zip(res.answers, ref.answers))
    return out


def table(summary: dict, reference: str) -> str:
    """Markdown: per kind and arm, items right, agreement with the reference, identical answers."""
    lines = [f"| task | arm | tasks | items right | item agreement with {reference} | identical answers |",
             "|---|---|---|---|---|---|"]
    for kind, arms in summary.items():
        for name, r in arms.items():
            lines.append(f"| {kind} | {name} | {r['tasks']} | {r['right']}/{r['items']} | "
                         f"{r['same_as_ref']}/{r['items']} | {r['identical']}/{r['answers']} |")
    return "\n".join(lines)
