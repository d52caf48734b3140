"""Helpers shared by the benchmarks: a Markdown table, the machine's description, JSON results.

Benchmarks are scripts (not CI); each prints a table and writes its numbers to
``bench/results/`` so a later run can be compared with this one.
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; floats get one decimal, None prints as an en dash."""

    def cell(value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, float):
            return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """CPU model, usable cores, load average and Python version: context for any number."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": cores, "load_average": load, "python": platform.python_version(),
            "platform": platform.platform()}


def write_json(name: str, payload: dict[str, Any], directory: Path = RESULTS_DIR) -> Path:
    """Write ``payload`` (plus a UTC timestamp) to ``<directory>/<name>-<timestamp>.json``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{stamp}.json"
    path.write_text(json.dumps({"utc": stamp, **payload}, indent=2, default=str) + "\n", encoding="utf-8")
    return path
