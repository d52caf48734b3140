"""File importance: personalized PageRank over the import/reference graph.

Like Aider's repo map, rank flows from a file to the files it imports or whose
definitions it references; personalization pulls rank toward focus files
(pinned, hot, open in the editor). Ties are broken by path by the caller.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

DAMPING = 0.85
ITERATIONS = 50
TOLERANCE = 1e-6


def pagerank(nodes: Sequence[str], edges: Mapping[str, Mapping[str, float]],
             focus: Iterable[str] = (), focus_weight: float = 10.0) -> dict[str, float]:
    """Personalized PageRank.

    Args:
        nodes: Every file.
        edges: file -> {depended-on file: weight}.
        focus: Files that get `focus_weight` times the base teleport mass.
        focus_weight: How strongly focus files pull.

    Returns:
        Rank per node; the values sum to 1.
    """
    n = len(nodes)
    if n == 0:
        return {}
    idx = {p: i for i, p in enumerate(nodes)}
    teleport = [1.0] * n
    for p in focus:
        if p in idx:
            teleport[idx[p]] = focus_weight
    total = sum(teleport)
    teleport = [t / total for t in teleport]
    out_edges: list[list[tuple[int, float]]] = []
    for p in nodes:
        targets = edges.get(p, {})
        weight = sum(targets.values())
        out_edges.append([(idx[q], w / weight) for q, w in sorted(targets.items()) if q in idx and weight > 0])
    rank = teleport[:]
    for _ in range(ITERATIONS):
        nxt = [(1.0 - DAMPING) * t for t in teleport]
        dangling = 0.0
        for i, outs in enumerate(out_edges):
            r = rank[i]
            if not outs:
                dangling += r
                continue
            r *= DAMPING
            for j, w in outs:
                nxt[j] += r * w
        if dangling:
            share = DAMPING * dangling
            nxt = [x + share * t for x, t in zip(nxt, teleport)]
        converged = sum(abs(a - b) for a, b in zip(nxt, rank)) < TOLERANCE
        rank = nxt
        if converged:
            break
    return {p: rank[i] for i, p in enumerate(nodes)}
