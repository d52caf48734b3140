"""A deterministic file order: pins first, then dependencies before dependents.

The import graph is condensed into strongly connected components (import
cycles); components are emitted in topological order, ties broken by the
smallest path in each, and files inside a component by path. The result depends
only on the set of paths and edges, never on discovery order.
"""
from __future__ import annotations

import heapq
from typing import Iterable, Mapping, Sequence

import pathspec


def components(nodes: Sequence[str], deps: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components (iterative Tarjan), each sorted by path.

    Args:
        nodes: Every node.
        deps: node -> nodes it depends on (edges to unknown nodes are ignored).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    known = set(nodes)
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(d for d in deps.get(start, ()) if d in known)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(d for d in deps.get(child, ()) if d in known))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    out.append(sorted(comp))
    return out


def dependency_order(nodes: Sequence[str], deps: Mapping[str, Iterable[str]]) -> list[str]:
    """Nodes with dependencies first; import cycles kept together; ties by path."""
    comps = components(nodes, deps)
    comp_of = {n: i for i, comp in enumerate(comps) for n in comp}
    waiting = [0] * len(comps)
    dependents: list[set[int]] = [set() for _ in comps]
    for i, comp in enumerate(comps):
        needed = {comp_of[d] for n in comp for d in deps.get(n, ()) if d in comp_of} - {i}
        waiting[i] = len(needed)
        for j in needed:
            dependents[j].add(i)
    ready = [(comp[0], i) for i, comp in enumerate(comps) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.extend(comps[i])
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (comps[j][0], j))
    return order


def pinned(paths: Sequence[str], pins: Sequence[str]) -> list[str]:
    """Paths matching the pin globs: in pin order, then by path within one pin."""
    out: list[str] = []
    seen: set[str] = set()
    for pin in pins:
        spec = pathspec.PathSpec.from_lines("gitignore", [pin])
        for p in sorted(paths):
            if p not in seen and spec.match_file(p):
                out.append(p)
                seen.add(p)
    return out
