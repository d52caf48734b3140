"""Fidelity tasks generated locally, deterministic per seed, with exact scoring.

- `needle_task`: 15 random codes, three in each of five regions of a filler
  text (about 1.5%, 25%, 50%, 75% and 98.5% of it); one question asks for all
  codes; each code is scored on its own.
- `variable_task`: RULER-style variable tracking: 5 chains of assignments
  (a value, then 4 hops of `VAR B = VAR A`) hidden in filler; one question per
  chain asks which variables hold its value; a chain is right when every one
  of its variables is named.

Texts are built from sentences; `n_sentences` sets the length (the runner
picks it from a token budget). No MLX here: tasks are plain data.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

NEEDLE_REGIONS = (0.015, 0.25, 0.50, 0.75, 0.985)
CODES_PER_REGION = 3
CHAINS = 5
HOPS = 4

_SUBJECTS = ("The river", "A small bird", "The old library", "The morning train", "A quiet street",
             "The garden", "The lighthouse", "A paper boat", "The mountain road", "The market")
_VERBS = ("passes", "watches", "follows", "remembers", "crosses", "reaches", "waits near", "circles")
_OBJECTS = ("the bridge", "the harbor", "a wooden fence", "the northern hills", "the clock tower",
            "an open window", "the stone wall", "the field of wheat", "the evening light")


@dataclass(frozen=True)
class Question:
    """One request over a task's context, with the facts a right answer names."""

    text: str
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    """A context and the questions asked over it."""

    kind: str
    seed: int
    context: str
    questions: tuple[Question, ...]


def filler(rng: random.Random, n: int) -> list[str]:
    """`n` plain sentences with no codes or variables in them."""
    return [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}." for _ in range(n)]


def _code(rng: random.Random) -> str:
    letters = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(2))
    return f"{letters}-{rng.randrange(1000, 10000)}"


def needle_task(seed: int, n_sentences: int) -> Task:
    """Fifteen codes in five regions; one question asks for all of them."""
    rng = random.Random(f"needle-{seed}")
    sentences = filler(rng, n_sentences)
    codes: list[str] = []
    while len(codes) < len(NEEDLE_REGIONS) * CODES_PER_REGION:
        code = _code(rng)
        if code not in codes:
            codes.append(code)
    # Insert from the back so earlier insertion points keep their meaning.
    for region in reversed(range(len(NEEDLE_REGIONS))):
        at = round(NEEDLE_REGIONS[region] * n_sentences)
        for k in reversed(range(CODES_PER_REGION)):
            code = codes[region * CODES_PER_REGION + k]
            sentences.insert(at, f"Remember the secret code {code}.")
    question = Question("List every secret code mentioned in the text above, one per line.", tuple(codes))
    return Task("needle", seed, " ".join(sentences), (question,))


def variable_task(seed: int, n_sentences: int) -> Task:
    """Five chains of a value and four hops; one question per chain."""
    rng = random.Random(f"variables-{seed}")
    names: list[str] = []
    while len(names) < CHAINS * (HOPS + 1):
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in names:
            names.append(name)
    values = rng.sample(range(10000, 100000), CHAINS)
    chains = [names[c * (HOPS + 1):(c + 1) * (HOPS + 1)] for c in range(CHAINS)]
    statements = []
    for hop in range(HOPS + 1):  # hop h of every chain comes before hop h+1 of any chain
        for chain, value in zip(chains, values):
            rhs = str(value) if hop == 0 else f"VAR {chain[hop - 1]}"
            statements.append(f"VAR {chain[hop]} = {rhs}.")
    sentences = filler(rng, n_sentences)
    slots = sorted(rng.choices(range(n_sentences + 1), k=len(statements)))
    for slot, statement in reversed(list(zip(slots, statements))):
        sentences.insert(slot, statement)
    questions = tuple(
        Question(f"Which variables are assigned the value {value}, directly or through other variables? "
                 "Answer with the variable names only.", tuple(chain))
        for chain, value in zip(chains, values))
    return Task("variables", seed, " ".join(sentences), questions)


def found(answer: str, fact: str) -> bool:
    """Whether `fact` appears in `answer` as a whole token (case-sensitive)."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(fact)}(?![A-Za-z0-9])", answer) is not None


def score(task: Task, answers: list[str]) -> list[tuple[str, bool]]:
    """Per-item results: (item, right) for each code (needle), chain (variables) or fact (code)."""
    if len(answers) != len(task.questions):
        raise ValueError(f"{task.kind} task has {len(task.questions)} questions, got {len(answers)} answers")
    if task.kind == "needle":
        (q,), (a,) = task.questions, answers
        return [(code, found(a, code)) for code in q.expected]
    label = "fact" if task.kind == "code" else "chain"
    return [(f"{label}:{q.expected[0]}", all(found(a, v) for v in q.expected))
            for q, a in zip(task.questions, answers)]
