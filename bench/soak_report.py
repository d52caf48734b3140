"""What bench/soak.py counts and how it reports it: outcomes and latencies by phase and kind of
request, the two Markdown tables and the JSON results."""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from bench._common import machine, markdown_table, write_json

ROOT = Path(__file__).resolve().parents[1]


class Tally:
    """Outcomes by (phase, kind, outcome) and latencies of answered valid requests."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.latency: dict[tuple[str, str], list[float]] = {}
        self.phase = "clean"
        self.sent = 0

    def add(self, kind: str, outcome: str, seconds: float | None = None) -> None:
        """Count one `outcome` of a request of `kind` in the current phase, with its latency if answered."""
        self.counts[(self.phase, kind, outcome)] += 1
        if outcome == "ok" and seconds is not None:
            self.latency.setdefault((self.phase, kind), []).append(seconds)

    def latencies(self, phase: str, kind: str | None = None) -> list[float]:
        """The sorted latencies (seconds) of answered valid requests in `phase`, of one `kind` or all."""
        return sorted(v for (p, k), values in self.latency.items() if p == phase and kind in (None, k)
                      for v in values)


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile of sorted `values` in milliseconds (None when empty)."""
    return 1000 * values[int(q * (len(values) - 1))] if values else None


def report(phases: list[dict], tally: Tally, args: argparse.Namespace, alive: bool, exit_code: int | None,
           unreadable: int) -> None:
    """Print the phase and the outcome tables, write the JSON results and print where.

    Args:
        phases: `run_phase`'s results, clean then abusive.
        tally: The outcomes and latencies of the whole run.
        args: The command line (recorded in the JSON).
        alive: Whether the server answered LSP and HTTP after the run.
        exit_code: The server's exit code after shutdown and exit.
        unreadable: The -32700 answers with id null (one per broken frame the server skipped).
    """
    rows = []
    for p in phases:
        counts = {k: v for k, v in tally.counts.items() if k[0] == p["phase"]}
        unexpected = sum(v for k, v in counts.items() if k[2].startswith("unexpected"))
        rows.append([p["phase"], round(p["seconds"]), sum(counts.values()), p["answered_valid"],
                     round(p["answered_valid"] / p["seconds"], 1), unexpected, p["p50_ms"], p["p95_ms"],
                     f"{p['before']['rss_kib'] // 1024} → {p['after']['rss_kib'] // 1024}",
                     f"{p['before']['fds']} → {p['after']['fds']}",
                     f"{p['before']['threads']} → {p['after']['threads']}"])
    print(markdown_table(["phase", "s", "requests", "valid answered", "valid/s", "unexpected", "p50 ms", "p95 ms",
                          "RSS MiB", "fds", "threads"], rows))
    print()
    kinds = sorted({(k[1], k[2]) for k in tally.counts})
    print(markdown_table(["kind", "outcome", "clean", "abusive", "p50 ms clean", "p50 ms abusive"],
                         [[kind, outcome, tally.counts.get(("clean", kind, outcome), 0),
                           tally.counts.get(("abusive", kind, outcome), 0),
                           *(percentile(tally.latencies(p, kind), 0.5) if outcome == "ok" else None
                             for p in ("clean", "abusive"))] for kind, outcome in kinds]))
    sent = sum(v for k, v in tally.counts.items() if k[1].startswith("lsp bad frame"))
    print(f"\nbroken LSP frames sent: {sent}; answered -32700 (id null): {unreadable}")
    print(f"server answered LSP and HTTP after the run: {alive}; exit code after shutdown/exit: {exit_code}")
    path = write_json("soak", {"machine": machine(), "args": vars(args), "phases": phases, "alive": alive,
                               "exit_code": exit_code, "broken_frames_sent": sent, "broken_frames_answered": unreadable,
                               "counts": [{"phase": k[0], "kind": k[1], "outcome": k[2], "n": v}
                                          for k, v in sorted(tally.counts.items())]})
    print(f"wrote {path.relative_to(ROOT)}")
