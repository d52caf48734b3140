"""Which files fit a token budget whole, and which only as signatures in the map.

Files are taken greedily in score order (personalized rank, boosted for files
that were selected last time: hysteresis), each kept whole if it still fits.
The rest get map entries in the same order while the map's share lasts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

_BATCH = 64
_MIN_USEFUL = 16
"""Stop looking for files to add once fewer tokens than this remain."""


@dataclass(frozen=True)
class Selection:
    """The outcome of a budget pass.

    Attributes:
        whole: Files included whole.
        mapped: Files with a map entry, in score order.
        omitted: Files neither whole nor mapped (over budget), in score order.
    """

    whole: frozenset[str]
    mapped: tuple[str, ...]
    omitted: tuple[str, ...]


def scores(rank: Mapping[str, float], previous: frozenset[str], hysteresis: float) -> dict[str, float]:
    """Rank with a bonus for previously selected files, so small edits do not swap files in and out."""
    return {p: r * (1.0 + hysteresis) if p in previous else r for p, r in rank.items()}


def by_score(score: Mapping[str, float]) -> list[str]:
    """Paths by descending score, ties by path (deterministic)."""
    return sorted(score, key=lambda p: (-score[p], p))


def greedy(paths: Sequence[str], cost: Callable[[Sequence[str]], Sequence[int]], limit: int) -> tuple[list[str], list[str], int]:
    """Takes paths in order while their cost fits `limit`.

    Args:
        paths: Candidates, best first.
        cost: Token cost of a batch of paths (called lazily, in batches).
        limit: Tokens available.

    Returns:
        (taken, not taken, tokens used).
    """
    taken: list[str] = []
    left: list[str] = []
    used = 0
    for start in range(0, len(paths), _BATCH):
        batch = paths[start:start + _BATCH]
        if limit - used < _MIN_USEFUL:
            left.extend(batch)
            continue
        for path, c in zip(batch, cost(batch)):
            if used + c <= limit:
                taken.append(path)
                used += c
            else:
                left.append(path)
    return taken, left, used


def fit(costs: Mapping[str, int], recent: Sequence[str], ranked: Sequence[str], avail: int, map_room: int,
        frame: int, map_cost: Callable[[Sequence[str]], Sequence[int]]) -> tuple[set[str], list[str], list[str]]:
    """Whole, map-only and omitted files for `avail` tokens.

    Args:
        costs: Tokens of each file whole.
        recent: Files edited or changed on disk, oldest first: kept whole first, newest first.
        ranked: Every file, best score first.
        avail: Tokens for the files and the map.
        map_room: Tokens kept for the map (its frame included) while files are taken whole.
        frame: Tokens of the map's frame.
        map_cost: Tokens of the map entries of a batch of files.

    Returns:
        (whole, mapped, omitted); mapped and omitted in the order they were considered.
    """
    def whole_cost(batch: Sequence[str]) -> list[int]:
        return [costs[p] for p in batch]

    kept, _, used = greedy(list(recent)[::-1], whole_cost, avail)
    kept_set = set(kept)
    candidates = [p for p in ranked if p not in kept_set and p in costs]
    taken, left, used2 = greedy(candidates, whole_cost, avail - used - map_room)
    left = [p for p in recent if p not in kept_set] + left
    mapped, omitted, _ = greedy(left, map_cost, avail - used - used2 - frame)
    return kept_set | set(taken), mapped, omitted
