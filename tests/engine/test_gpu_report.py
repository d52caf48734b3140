"""bench/gpu_report.py's reading of the issue's decode goal: 8-bit KV against bf16 by the median over the asks run
in both widths, each ask's ratio listed (one ask's rate swings with the bf16 path's host time)."""
from __future__ import annotations

import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def row(config: str, step: str, tps: float) -> dict:
    return {"length": 131072, "config": config, "step": step, "decode_tps": tps, "ttft_s": 0.2,
            "decode_bound_tps": 99.0}


def test_the_decode_goal_reads_the_median_of_the_asks_ratios(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    report = importlib.import_module("bench.gpu_report")
    bf16 = {"cold ask": 42.8, "follow-up": 44.5, "edit + ask": 50.4, "edit, warm-up, ask": 50.3}  # run u
    eight = {"cold ask": 57.2, "follow-up": 62.5, "edit + ask": 58.5, "edit, warm-up, ask": 58.9}
    rows = [row("window-16", s, v) for s, v in bf16.items()] + [row("window-8", s, v) for s, v in eight.items()]
    ratios = report.decode_ratios({"rows": rows}, 131072)
    assert list(ratios) == list(report.ASKS) and abs(ratios["follow-up"] - 62.5 / 44.5) < 1e-9
    goal, = [g for g in report.goals({"rows": rows}) if "decode 8-bit KV" in g["goal"]]
    assert not goal["met"] and goal["value"].startswith("1.25x (cold ask 1.34x, follow-up 1.40x")
    faster = [r if r["config"] == "window-16" else {**r, "decode_tps": r["decode_tps"] * 1.1} for r in rows]
    goal, = [g for g in report.goals({"rows": faster}) if "decode 8-bit KV" in g["goal"]]
    assert goal["met"]  # median 1.38x
    one_width = [r for r in rows if r["config"] == "window-8"]
    assert report.decode_ratios({"rows": one_width}, 131072) == {}
