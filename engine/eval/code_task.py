"""Code questions over a fixture repository, checked by exact facts.

The fixture (`engine/eval/data/ledger`, five small Python files) holds the
facts the questions ask for: a constant, a rate, an exception, a function,
a program name. To reach a target length the fixture files are spread over
generated filler modules (plain arithmetic helpers that share no names or
numbers with the facts) at about 1.5%, 25%, 50%, 75% and 98.5% of the
repository, in a per-seed order, so answers depend on windowed positions.
Deterministic per seed; no MLX here.
"""
from __future__ import annotations

import random
from pathlib import Path

from engine.eval.tasks import NEEDLE_REGIONS, Question, Task

FIXTURE = Path(__file__).parent / "data" / "ledger"

QUESTIONS = (  # (fixture file, question, the exact fact a right answer names)
    ("config.py", "What is the value of DEFAULT_PORT in ledger/config.py? Answer with the number only.",
     "8731"),
    ("config.py", "What is SESSION_TIMEOUT_SECONDS set to in ledger/config.py? Answer with the number only.",
     "2750"),
    ("errors.py", "Which exception class in ledger/errors.py is raised when an account is frozen? "
     "Answer with the class name only.", "FrozenAccountError"),
    ("accounts.py", "Which exception does Account.withdraw in ledger/accounts.py raise when the amount "
     "is larger than the balance? Answer with the class name only.", "InsufficientFundsError"),
    ("accounts.py", "Which function in ledger/accounts.py appends an entry to the audit trail? "
     "Answer with the function name only.", "record_audit_entry"),
    ("rates.py", "What is the fee rate of the premium plan in ledger/rates.py? Answer with the number only.",
     "0.0075"),
    ("rates.py", "What is MINIMUM_FEE_CENTS in ledger/rates.py? Answer with the number only.", "35"),
    ("cli.py", "What program name does build_parser in ledger/cli.py give to argparse? "
     "Answer with the name only.", "ledger-admin"),
    ("cli.py", "Which function in ledger/cli.py turns cents into text like 1,234.56? "
     "Answer with the function name only.", "format_currency"),
)

_VERBS = ("scale", "blend", "shift", "clamp", "merge", "split", "weigh", "count", "pack", "trim")
_NOUNS = ("sample", "bucket", "vector", "window", "signal", "offset", "series", "record", "range", "batch")


def fixture_files() -> dict[str, str]:
    """The fixture repository: path -> text."""
    return {f"ledger/{p.name}": p.read_text() for p in sorted(FIXTURE.glob("*.py"))}


def filler_module(rng: random.Random, index: int) -> tuple[str, str]:
    """A generated helper module (path, text) with a few small arithmetic functions."""
    lines = [f'"""Numeric helpers, part {index}."""', ""]
    for _ in range(rng.randint(2, 4)):
        name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{rng.randrange(100, 1000)}"
        a, b = rng.randrange(2, 20), rng.randrange(2, 20)
        lines += ["", f"def {name}(values: list[float], factor: float = {a / 4}) -> list[float]:",
                  f'    """Multiply each value by factor, then add {b}."""',
                  f"    return [v * factor + {b} for v in values]", ""]
    return f"util/helpers_{index:03d}.py", "\n".join(lines)


def render(files: list[tuple[str, str]]) -> str:
    """Files as the prompt shows them: a path line, then the fenced text."""
    return "\n".join(f"File: {path}\n```python\n{text.rstrip()}\n```\n" for path, text in files)


def code_task(seed: int, n_modules: int) -> Task:
    """The fixture spread over `n_modules` filler modules; one question per fact.

    Args:
        seed: Chooses the filler and the order of the fixture files.
        n_modules: Filler modules (sets the length, about 90 tokens each).

    Returns:
        A Task of kind "code" whose questions each expect one fact.
    """
    rng = random.Random(f"code-{seed}")
    modules = [filler_module(rng, i) for i in range(n_modules)]
    fixture = list(fixture_files().items())
    rng.shuffle(fixture)
    # Insert from the back so earlier insertion points keep their meaning.
    for region, item in reversed(list(zip(NEEDLE_REGIONS, fixture))):
        modules.insert(round(region * n_modules), item)
    questions = tuple(Question(text, (fact,)) for _, text, fact in QUESTIONS)
    return Task("code", seed, render(modules), questions)
