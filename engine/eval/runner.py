"""Run fidelity tasks under several arms (attention policy x KV bits) and compare them.

Each task's context is prefilled once per arm as a stable segment (windowed
up to its dense tail when the arm's policy is enabled); every question is then
prefilled densely after it, answered greedily, and the cache trimmed back to
the context (an offset mark, as checkpoints do). Scores are per item (code or
chain); paired agreement compares each arm's answers with the reference arm's.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from engine.eval.tasks import Task, score
from engine.generate import decode, prefill
from engine.request import PromptSegment
from engine.sampling import greedy
from engine.window import WindowPolicy, make_window_cache, set_dense_from

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


def answer_task(model: Any, tokenizer: Any, task: Task, arm: Arm, *,
                chunk: int = 256, max_tokens: int = 96) -> tuple[list[str], int]:
    """Greedy answers to every question of `task` under `arm`, and the context's token count."""
    head, tail = template_parts(tokenizer)
    ctx_ids = tokenizer.encode(head + task.context + "\n\n")
    caches = make_window_cache(model, arm.policy, arm.kv_bits)
    set_dense_from(caches, arm.policy.dense_from([PromptSegment("file", "context", tuple(ctx_ids))]))
    prefill(model, caches, ctx_ids, chunk)
    mark = caches[0].offset
    answers = []
    for question in task.questions:
        logits = prefill(model, caches, tokenizer.encode(question.text + tail), chunk)
        ids = list(decode(model, caches, logits, greedy, max_tokens, tokenizer.eos_token_ids))
        answers.append(tokenizer.decode(ids))
        for c in caches:
            c.trim(c.offset - mark)
    return answers, len(ctx_ids)


def run_tasks(model: Any, tokenizer: Any, tasks: Sequence[Task], arms: Sequence[Arm], **kw) -> list[TaskRun]:
    """Every task under every arm."""
    runs = []
    for task in tasks:
        run = None
        for arm in arms:
            tic = time.perf_counter()
            answers, n_ctx = answer_task(model, tokenizer, task, arm, **kw)
            run = run or TaskRun(task, n_ctx)
            run.results[arm.name] = ArmResult(arm.name, answers, score(task, answers),
                                              time.perf_counter() - tic)
            logger.info("%s seed %d (%d tokens) %s: %d/%d", task.kind, task.seed, n_ctx, arm.name,
                        sum(ok for _, ok in run.results[arm.name].items), len(run.results[arm.name].items))
        runs.append(run)
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
