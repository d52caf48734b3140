"""How long the language server's event loop stands still while a branch switch goes into its prompt.

A checkout, or a replace in many open buffers, marks many files changed; the next prompt applies them all,
and in a budgeted workspace that folds the hot tail into place: a full rebuild of the layout (1-2.5 s for 300
files in bench/context.py). Until the twenty-second session the server applied them on its event loop, which
answered nothing meanwhile (edits, cancels, status); now they are applied on the prompt's own thread
(`WorkspacePrompt.call`). Both ways run here in one process, alternating, over one `WorkspacePrompt` with the
server's budget: each round gives `--switch` open buffers new text, then applies them (on the loop, the peer;
or through `WorkspacePrompt.call`), while a ticker on the loop wakes every `--tick-ms` and records how late each
wake-up came. The longest lateness is how long the loop stood still.

    python bench/loop_lag.py [--tokenizer DIR] [--budget 6000] [--switch 300] [--rounds 2] [--only NAME]

Targets as bench/context.py's (this repository, the installed `transformers`), each with a fresh
$CODECTX_HOME. Prints a table and writes JSON to bench/results/.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import machine, markdown_table, write_json  # noqa: E402
from bench.context import _targets  # noqa: E402

WAYS = ("on the loop", "prompt's thread")


async def ticks(stop: asyncio.Event, tick_s: float, late: list[float]) -> None:
    """Wakes every `tick_s` until `stop`; appends how late each wake-up came (seconds)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        asked = loop.time()
        await asyncio.sleep(tick_s)
        late.append(loop.time() - asked - tick_s)


async def one_switch(prompt, buffers: dict, paths: list[Path], tag: str, on_loop: bool, tick_s: float) -> dict:
    """`paths` given new buffer texts, then applied one way; the time it took and the loop's lateness meanwhile."""
    for n, path in enumerate(paths):
        buffers[path] = path.read_text(encoding="utf-8", errors="replace") + f"\n# {tag} {n}\n" * 4
        prompt.mark_dirty(path)
    folds: list[bool] = []
    build = prompt.workspace.build
    prompt.workspace.build = lambda fold=False: (folds.append(fold), build(fold))[1]
    stop, late = asyncio.Event(), []
    ticker = asyncio.ensure_future(ticks(stop, tick_s, late))
    await asyncio.sleep(2 * tick_s)  # the ticker runs before the switch starts
    began = time.perf_counter()
    if on_loop:
        prompt.settle()
    else:
        await prompt.call(prompt.settle)
    seconds = time.perf_counter() - began
    await asyncio.sleep(2 * tick_s)
    stop.set()
    await ticker
    del prompt.workspace.build  # the instance attribute: the class's method again
    return {"way": WAYS[0] if on_loop else WAYS[1], "seconds": round(seconds, 3), "folds": folds.count(True),
            "longest_stall_ms": round(max(late) * 1e3, 1), "median_late_ms": round(statistics.median(late) * 1e3, 2),
            "ticks": len(late)}


async def measure(target: Path, tokenizer_dir: str, budget: int, switch: int, rounds: int, tick_s: float) -> dict:
    from context.hf_tokenizer import HFTokenizer
    from server.core.prompt import WorkspacePrompt
    from server.core.settings import ContextSettings

    buffers: dict[Path, str] = {}
    started = time.perf_counter()
    prompt = WorkspacePrompt(target, HFTokenizer.from_dir(tokenizer_dir), buffers.get, "",
                             ContextSettings(budget_tokens=budget))
    build_s = time.perf_counter() - started
    keys = sorted(prompt.workspace.files)
    paths = [target / key for key in keys[::max(1, len(keys) // switch)][:switch]]
    runs = []
    for n in range(rounds):  # alternating, each way first in every other round
        for on_loop in ((True, False) if n % 2 == 0 else (False, True)):
            runs.append(await one_switch(prompt, buffers, paths, f"round {n} {on_loop}", on_loop, tick_s))
    prompt.close()
    return {"files": len(keys), "switched": len(paths), "build_s": round(build_s, 2), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default=str(Path.home() / ".cache/codectx/models/smollm2-135m"),
                        help="folder with tokenizer.json (default: the cached default model)")
    parser.add_argument("--budget", type=int, default=6000, help="the prefix budget (the server's default)")
    parser.add_argument("--switch", type=int, default=300, help="open buffers a switch changes")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both ways")
    parser.add_argument("--tick-ms", type=float, default=5.0, help="the ticker's period")
    parser.add_argument("--only", help="one target name")
    args = parser.parse_args()
    results, rows = {}, []
    for name, path in _targets().items():
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory() as home:
            os.environ["CODECTX_HOME"] = home
            results[name] = asyncio.run(measure(path, args.tokenizer, args.budget, args.switch, args.rounds,
                                                args.tick_ms / 1000))
        for way in WAYS:
            runs = [r for r in results[name]["runs"] if r["way"] == way]
            rows.append((name, results[name]["switched"], way, statistics.median(r["seconds"] for r in runs),
                         max(r["longest_stall_ms"] for r in runs), statistics.median(r["median_late_ms"] for r in runs),
                         sum(r["folds"] for r in runs)))
    print(markdown_table(("target", "buffers changed", "applied", "apply s (median)", "longest loop stall ms",
                          "median tick lateness ms", "folds"), rows))
    out = write_json("loop_lag", {"machine": machine(), "budget": args.budget, "tick_ms": args.tick_ms,
                                  "results": results})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
