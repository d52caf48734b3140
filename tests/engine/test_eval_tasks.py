"""Fidelity task generators are deterministic per seed; scoring is right on known answers."""
from __future__ import annotations

import re

import pytest

from engine.eval.runner import ArmResult, TaskRun, summarize
from engine.eval.tasks import CHAINS, HOPS, found, needle_task, score, variable_task


def test_generators_are_deterministic_per_seed_and_differ_across_seeds():
    for make in (needle_task, variable_task):
        assert make(3, 400) == make(3, 400)
        assert make(3, 400).context != make(4, 400).context


def test_needle_codes_sit_in_their_five_regions():
    task = needle_task(7, 1000)
    codes = task.questions[0].expected
    assert len(codes) == 15 and len(set(codes)) == 15
    positions = [task.context.index(code) / len(task.context) for code in codes]
    for region, centre in enumerate((0.015, 0.25, 0.5, 0.75, 0.985)):
        for pos in positions[region * 3:(region + 1) * 3]:
            assert abs(pos - centre) < 0.02


def test_variable_chains_resolve_to_their_values():
    task = variable_task(5, 300)
    assignments = dict(re.findall(r"VAR (\w+) = (VAR \w+|\d+)\.", task.context))
    assert len(assignments) == CHAINS * (HOPS + 1)

    def value_of(name: str) -> str:
        rhs = assignments[name]
        return value_of(rhs[4:]) if rhs.startswith("VAR ") else rhs

    for q in task.questions:
        value = re.search(r"value (\d+)", q.text).group(1)
        assert len(q.expected) == HOPS + 1
        assert {value_of(v) for v in q.expected} == {value}


def test_scoring_on_known_answers():
    needle = needle_task(1, 200)
    codes = needle.questions[0].expected
    answer = "\n".join(codes[:10]) + "\nXX-0000"
    items = score(needle, [answer])
    assert [ok for _, ok in items] == [True] * 10 + [False] * 5
    assert not found("AB-12345", "AB-1234")  # whole tokens only

    tracking = variable_task(1, 200)
    perfect = [" ".join(q.expected) for q in tracking.questions]
    partial = perfect[:4] + [" ".join(tracking.questions[4].expected[:-1])]
    assert all(ok for _, ok in score(tracking, perfect))
    assert [ok for _, ok in score(tracking, partial)] == [True, True, True, True, False]
    with pytest.raises(ValueError):
        score(tracking, perfect[:2])


def test_summary_counts_agreement_and_lists_failures():
    task = needle_task(2, 100)
    codes = task.questions[0].expected
    run = TaskRun(task, 1234)
    ref_answer, other_answer = "\n".join(codes), "\n".join(codes[1:])
    run.results["dense"] = ArmResult("dense", [ref_answer], score(task, [ref_answer]), 1.0)
    run.results["window"] = ArmResult("window", [other_answer], score(task, [other_answer]), 1.0)
    summary = summarize([run], "dense")["needle"]
    assert summary["dense"]["same_as_ref"] == 15 and summary["dense"]["identical"] == 1
    assert summary["window"]["right"] == 14 and summary["window"]["same_as_ref"] == 14
    assert summary["window"]["identical"] == 0
    assert summary["window"]["failures"] == [dict(seed=2, tokens=1234, item=codes[0], ref=True, this=False)]


def test_runner_on_a_tiny_model_window_covering_the_context_agrees_exactly(tiny_loaded):
    from engine.eval.runner import Arm, run_tasks
    from engine.window import WindowPolicy

    from engine.eval.code_task import QUESTIONS, code_task

    tasks = [needle_task(0, 30), variable_task(0, 12), code_task(0, 2)]
    arms = [Arm("dense", WindowPolicy(enabled=False)),
            Arm("covering", WindowPolicy(global_tokens=4096, window_tokens=4096, dense_tail=16)),
            Arm("window-8", WindowPolicy(global_tokens=32, window_tokens=32, dense_tail=16), kv_bits=8)]
    runs = run_tasks(tiny_loaded, tasks, arms, chunk=64, max_tokens=4)
    assert [r.task.kind for r in runs] == ["needle", "variables", "code"]
    assert runs[0].context_tokens > 32 + 32 + 16  # the small window really windows
    for run in runs:
        assert run.results["covering"].answers == run.results["dense"].answers
        assert len(run.results["window-8"].answers) == len(run.task.questions)
    summary = summarize(runs, "dense")
    assert summary["variables"]["covering"]["identical"] == CHAINS
    assert summary["needle"]["window-8"]["items"] == 15
    assert summary["code"]["covering"]["identical"] == summary["code"]["covering"]["answers"] == len(QUESTIONS)
