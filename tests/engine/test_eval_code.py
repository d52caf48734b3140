"""The code-questions task: deterministic per seed, facts placed by region, exact scoring."""
from __future__ import annotations

from engine.eval.code_task import QUESTIONS, code_task, fixture_files
from engine.eval.tasks import NEEDLE_REGIONS, found, score


def test_code_task_is_deterministic_per_seed():
    assert code_task(3, 40) == code_task(3, 40)
    assert code_task(3, 40).context != code_task(4, 40).context


def test_every_fact_is_in_the_fixture_and_in_the_context():
    files = fixture_files()
    assert len(files) == len(NEEDLE_REGIONS)
    task = code_task(0, 60)
    for path, question, fact in QUESTIONS:
        assert found(files[f"ledger/{path}"], fact), (path, fact)
        assert found(task.context, fact)
    assert [q.expected for q in task.questions] == [(fact,) for _, _, fact in QUESTIONS]


def test_fixture_files_sit_at_the_five_regions():
    n = 200
    task = code_task(1, n)
    blocks = task.context.split("File: ")[1:]
    positions = [i for i, block in enumerate(blocks) if block.startswith("ledger/")]
    assert len(blocks) == n + len(NEEDLE_REGIONS)
    expected = [round(r * n) + k for k, r in enumerate(NEEDLE_REGIONS)]
    assert positions == expected


def test_scoring_on_known_answers():
    task = code_task(2, 10)
    facts = [q.expected[0] for q in task.questions]
    assert score(task, facts) == [(f"fact:{f}", True) for f in facts]
    wrong = ["I do not know."] * len(facts)
    assert not any(ok for _, ok in score(task, wrong))
    # Whole tokens only: a longer number or name does not count.
    assert not found("It listens on 87310.", "8731")
    assert not found("FrozenAccountErrorX", "FrozenAccountError")
    assert found("The program is `ledger-admin`.", "ledger-admin")
