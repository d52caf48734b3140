"""Benchmark of `context`: cold build, warm-cache build and incremental update.

Targets: this repository and the installed `transformers` package (~3k files).
Each target runs in its own process (so peak RSS is per target) with a fresh
$CODECTX_HOME: pass 1 is fully cold (parse + tokenize everything), pass 2 is a
new Workspace over warm token/tag caches ("after the first tokenization"),
then single-file updates are timed, and last a branch switch: `--switch` files updated one after another (as
the language server applies them after a checkout, `WorkspacePrompt._flush`), in the unbudgeted and the
budgeted workspace, the total and the longest single update (where the hot tail outgrew its share and the
workspace folded it: a full rebuild), and in the budgeted one again with every text recorded before any is
applied, as the server applies a batch (on the prompt's own thread: bench/loop_lag.py times its event loop). Prints a table and writes JSON to bench/results/.

    python bench/context.py [--tokenizer DIR] [--budget N] [--updates 20] [--switch 300]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

T = TypeVar("T")


def _targets() -> dict[str, Path]:
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    out = {"codectx": ROOT}
    if spec and spec.origin:
        out["transformers"] = Path(spec.origin).parent
    return out


def timed(work: Callable[[], T]) -> tuple[T, float, float]:
    """`work()`'s result, its wall seconds and this process's CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - t0, time.process_time() - c0


def built(target: Path, tok, **options) -> tuple[Any, Any]:
    """A new `Workspace` over `target` and the layout its build returned."""
    from context.workspace import Workspace

    ws = Workspace(target, tok, **options)
    return ws, ws.build()


@dataclass
class Builds:
    """The four builds of one target: workspaces (alive until the peak RSS is read), layouts and timings."""

    cold_ws: Any
    cold: Any
    cold_s: float
    cold_cpu: float
    warm_ws: Any
    warm: Any
    warm_s: float
    warm_cpu: float
    first_budget_s: float
    first_budget_cpu: float
    budget_ws: Any
    budgeted: Any
    budget_s: float
    budget_cpu: float


def build_phases(target: Path, tok, budget: int | None) -> Builds:
    """Cold, warm, first budgeted (it ranks the files) and steady budgeted (saved edges and ranks) builds."""
    (cold_ws, cold), cold_s, cold_cpu = timed(lambda: built(target, tok))
    (warm_ws, warm), warm_s, warm_cpu = timed(lambda: built(target, tok))
    first_budget_s, first_budget_cpu = timed(lambda: built(target, tok, budget=budget))[1:]  # not kept
    (budget_ws, budgeted), budget_s, budget_cpu = timed(lambda: built(target, tok, budget=budget))
    return Builds(cold_ws, cold, cold_s, cold_cpu, warm_ws, warm, warm_s, warm_cpu, first_budget_s, first_budget_cpu,
                  budget_ws, budgeted, budget_s, budget_cpu)


def read(target: Path, key: str) -> str:
    """The text of file `key` under `target`, as the workspace reads it."""
    return (target / key).read_text(encoding="utf-8", errors="replace")


def hot_updates(ws, key: str, text: str, updates: int) -> tuple[float, list[float], list[float]]:
    """Edit one file over and over (hot after the first edit).

    Returns:
        The first update's ms, then the later updates' wall ms and CPU ms.
    """
    first_ms, hot_ms, hot_cpu_ms = [], [], []
    for i in range(updates):
        t0, c0 = time.perf_counter(), time.process_time()
        ws.update(key, text + f"\n# edit {i}\n")
        (first_ms if i == 0 else hot_ms).append((time.perf_counter() - t0) * 1000)
        if i:
            hot_cpu_ms.append((time.process_time() - c0) * 1000)
    return first_ms[0], hot_ms, hot_cpu_ms


def big_updates(ws, key: str, text: str, updates: int) -> tuple[float, list[float]]:
    """Edit near the top of a large file, over and over: the first update's ms and the later ones'."""
    big_ms, big_first_ms = [], 0.0
    for i in range(updates):
        t0 = time.perf_counter()
        ws.update(key, text.replace("\n", f"\n# big edit {i}\n", 1))  # an edit near the top
        elapsed = (time.perf_counter() - t0) * 1000
        if i:
            big_ms.append(elapsed)
        else:
            big_first_ms = elapsed
    return big_first_ms, big_ms


def budget_updates(ws, key: str, text: str, updates: int) -> tuple[list[float], list[float]]:
    """Edit one file of a budgeted workspace over and over: wall ms and CPU ms per update."""
    budget_ms, budget_cpu_ms = [], []
    for i in range(updates):
        t0, c0 = time.perf_counter(), time.process_time()
        ws.update(key, text + f"\n# budget edit {i}\n")
        budget_ms.append((time.perf_counter() - t0) * 1000)
        budget_cpu_ms.append((time.process_time() - c0) * 1000)
    return budget_ms, budget_cpu_ms


def branch_switch(ws, target: Path, count: int, recorded_first: bool = False) -> tuple[float, float, float]:
    """`count` files of the workspace (spread over their order) updated one after another: total seconds, the
    longest update's ms and the median update's ms. `recorded_first`: every text recorded before any is applied
    (`Workspace.update`'s `apply`), as the server applies a batch (`WorkspacePrompt._flush`)."""
    keys = sorted(ws.files)
    keys = keys[::max(1, len(keys) // count)][:count]
    texts = {key: read(target, key) + f"\n# changed on another branch ({int(recorded_first)})\n" for key in keys}
    began = time.perf_counter()
    if recorded_first:
        for key in keys:
            ws.update(key, texts[key], apply=False)
    times = []
    for key in keys:
        t0 = time.perf_counter()
        ws.update(key, texts[key])
        times.append(time.perf_counter() - t0)
    return time.perf_counter() - began, max(times) * 1000, statistics.median(times) * 1000


def measure(target: Path, tokenizer_dir: str, budget: int | None, updates: int, switch: int = 300) -> dict:
    """Runs in the child process: all phases on one target.

    Args:
        target: The repository to lay out.
        tokenizer_dir: A folder with tokenizer.json.
        budget: The token budget of the budgeted builds.
        updates: Single-file updates timed per kind of update.
        switch: Files the branch switch changes.

    Returns:
        The target's numbers (the JSON `main` collects per target).
    """
    from context.hf_tokenizer import HFTokenizer

    b = build_phases(target, HFTokenizer.from_dir(tokenizer_dir), budget)
    cold, budgeted = b.cold, b.budgeted
    n_files = len(cold.rows)
    # Updates: edit a file in the middle of the order, then keep editing it (now hot).
    files = [s for s in b.warm.segments if s.kind == "file"]
    victim = files[len(files) // 2].key
    text = read(target, victim)
    first_ms, hot_ms, hot_cpu_ms = hot_updates(b.warm_ws, victim, text, updates)
    big = max(files, key=lambda s: (len(s.text), s.key)).key  # the largest kept file
    big_text = read(target, big)
    big_first_ms, big_ms = big_updates(b.warm_ws, big, big_text, updates)
    budget_victim = next(s.key for s in budgeted.segments[::-1] if s.kind == "file")
    budget_ms, budget_cpu_ms = budget_updates(b.budget_ws, budget_victim, read(target, budget_victim), updates)
    switch_s, switch_longest_ms, switch_median_ms = branch_switch(b.cold_ws, target, switch)
    budget_switch_s, budget_switch_longest_ms, _ = branch_switch(b.budget_ws, target, switch)
    recorded_s, recorded_longest_ms, _ = branch_switch(b.budget_ws, target, switch, recorded_first=True)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "files": n_files, "skipped": len(cold.skipped), "tokens": cold.tokens,
        "bytes": sum(len(s.text.encode()) for s in cold.segments),
        "cold_cpu_s": b.cold_cpu, "warm_cpu_s": b.warm_cpu, "budget_cpu_s": b.budget_cpu,
        "budget_files_per_s": n_files / b.budget_s,
        "cold_s": b.cold_s, "cold_files_per_s": n_files / b.cold_s,
        "warm_s": b.warm_s, "warm_files_per_s": n_files / b.warm_s,
        "budget": budget, "budget_build_s": b.budget_s, "budget_tokens": budgeted.tokens,
        "budget_whole_files": sum(1 for s in budgeted.segments if s.kind in ("file", "hot")),
        "update_first_ms": first_ms, "update_hot_median_ms": statistics.median(hot_ms),
        "update_hot_p95_ms": sorted(hot_ms)[int(0.95 * (len(hot_ms) - 1))],
        "update_budget_median_ms": statistics.median(budget_ms),
        "update_hot_median_cpu_ms": statistics.median(hot_cpu_ms),
        "update_budget_median_cpu_ms": statistics.median(budget_cpu_ms),
        "first_budget_build_s": b.first_budget_s, "first_budget_build_cpu_s": b.first_budget_cpu,
        "update_big_first_ms": big_first_ms, "update_big_median_ms": statistics.median(big_ms),
        "update_big_file": big, "update_big_chars": len(big_text),
        "update_victim": victim, "update_victim_chars": len(text), "budget_victim": budget_victim,
        "switch_files": switch, "switch_s": switch_s, "switch_longest_ms": switch_longest_ms,
        "switch_median_ms": switch_median_ms, "budget_switch_s": budget_switch_s,
        "budget_switch_longest_ms": budget_switch_longest_ms, "budget_switch_recorded_first_s": recorded_s,
        "budget_switch_recorded_first_longest_ms": recorded_longest_ms, "peak_rss_mb": rss_mb,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default=str(Path.home() / ".cache/codectx/models/smollm2-135m"),
                        help="folder with tokenizer.json (default: the cached default model)")
    parser.add_argument("--budget", type=int, default=6144, help="budget for the budgeted build")
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--switch", type=int, default=300, help="files a branch switch changes")
    parser.add_argument("--only", help="one target name")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = measure(Path(args.child), args.tokenizer, args.budget, args.updates, args.switch)
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    results = {}
    for name, path in _targets().items():
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory() as home:
            env = dict(os.environ, CODECTX_HOME=home)
            out = subprocess.run([sys.executable, __file__, "--child", str(path), "--tokenizer", args.tokenizer,
                                  "--budget", str(args.budget), "--updates", str(args.updates),
                                  "--switch", str(args.switch)],
                                 env=env, capture_output=True, text=True, check=True)
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    header = ("target", "files", "MB", "tokens", "cold s (cpu)", "warm s (cpu)", "warm f/s",
              "budget 1st s (cpu)", "budget s (cpu)", "budget f/s", "upd first ms", "upd hot ms (cpu)",
              "upd big 1st/hot ms", "upd budget ms (cpu)", "switch s (longest, median ms)",
              "budget switch s (longest ms)", "recorded first s (longest ms)", "peak MB")
    rows = [header]
    for name, r in results.items():
        rows.append((name, str(r["files"]), f"{r['bytes'] / 1e6:.1f}", str(r["tokens"]),
                     f"{r['cold_s']:.2f} ({r['cold_cpu_s']:.2f})", f"{r['warm_s']:.2f} ({r['warm_cpu_s']:.2f})",
                     f"{r['warm_files_per_s']:.0f}",
                     f"{r['first_budget_build_s']:.2f} ({r['first_budget_build_cpu_s']:.2f})",
                     f"{r['budget_build_s']:.2f} ({r['budget_cpu_s']:.2f})",
                     f"{r['budget_files_per_s']:.0f}", f"{r['update_first_ms']:.1f}",
                     f"{r['update_hot_median_ms']:.1f} ({r['update_hot_median_cpu_ms']:.1f})",
                     f"{r['update_big_first_ms']:.1f}/{r['update_big_median_ms']:.1f}",
                     f"{r['update_budget_median_ms']:.1f} ({r['update_budget_median_cpu_ms']:.1f})",
                     f"{r['switch_s']:.2f} ({r['switch_longest_ms']:.0f}, {r['switch_median_ms']:.2f})",
                     f"{r['budget_switch_s']:.2f} ({r['budget_switch_longest_ms']:.0f})",
                     f"{r['budget_switch_recorded_first_s']:.2f} ({r['budget_switch_recorded_first_longest_ms']:.0f})",
                     f"{r['peak_rss_mb']:.0f}"))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    sys.stdout.write("\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows) + "\n")
    out_path = ROOT / "bench" / "results" / f"context-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"tokenizer": args.tokenizer, "cpus": os.cpu_count(), "results": results},
                                   indent=1))
    sys.stdout.write(f"wrote {out_path.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
