"""Benchmark of speculative decoding on the default model: off / lookup / draft / auto.

Tasks: three edit-style requests over real code from this repository (rewrite a
function with a docstring, rename a symbol across a file, explain a function
quoting it) and two free-form questions. Each task is prefilled once and
decoded once per mode with the engine's decode functions; decode tok/s, drafted/accepted tokens and whether the
greedy output is identical to mode `off` are recorded.

The draft model is the target's first `--draft-layers` layers with its own
final norm and head (a layer-skip self-draft): SmolLM2-135M has no smaller
sibling with the same tokenizer, and this one shares every weight.

It also measures the verification cost that `auto` mode's break-even uses:
the time of one target forward over n tokens against a one-token forward.

    python bench/speculative.py [--max-tokens 64] [--draft-layers 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.draft_model import DraftModelDrafter  # noqa: E402  (engine first: BLAS preload)
from engine.generate import decode, prefill  # noqa: E402
from engine.kv import make_cache  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.request import Metrics  # noqa: E402
from engine.sampling import greedy  # noqa: E402
from engine.speculative_decode import speculative_decode  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402


def _function_source(path: str, name: str) -> str:
    text = (ROOT / path).read_text()
    start = text.index(f"def {name}(")
    end = text.find("\ndef ", start + 1)
    return text[start : end if end > 0 else len(text)].rstrip() + "\n"


MODES = ("off", "lookup", "draft", "auto")


def tasks() -> list[dict]:
    """(name, kind, user message) of every task."""
    spans = _function_source("engine/generate.py", "chunk_spans")
    spans_bare = spans.split('"""')[0] + spans.split('"""')[2].lstrip("\n") if '"""' in spans else spans
    kv = (ROOT / "engine/kv.py").read_text()
    verify = _function_source("engine/speculative.py", "verify_greedy")
    return [
        {"name": "rewrite-docstring", "kind": "edit",
         "message": "Rewrite this Python function, adding a docstring. Output the whole function.\n\n"
                    f"```python\n{spans_bare}```"},
        {"name": "rename-symbol", "kind": "edit",
         "message": "Rename `cache_offset` to `cache_length` everywhere in this file. "
                    f"Output the whole file.\n\n```python\n{kv}```"},
        {"name": "explain-quoting", "kind": "edit",
         "message": "Explain what this function does, quoting each line before explaining it.\n\n"
                    f"```python\n{verify}```"},
        {"name": "free-capital", "kind": "free",
         "message": "Tell me about the history of Paris in a few paragraphs."},
        {"name": "free-advice", "kind": "free",
         "message": "How can I become a better programmer? Give practical advice."},
    ]


def truncated_draft(model, layers: int):
    """The target's first `layers` layers, final norm and head, sharing weights."""
    cls = type(model)
    draft = cls(replace(model.args, num_hidden_layers=layers))
    params = model.parameters()
    params["model"]["layers"] = params["model"]["layers"][:layers]
    draft.update(params)
    mx.eval(draft.parameters())
    return draft


def verify_cost(model, context: int = 512, sizes=(1, 2, 3, 5, 9, 13), repeats: int = 7) -> dict:
    """Median wall and CPU seconds of one forward over n new tokens after `context` cached ones."""
    cache = make_prompt_cache(model)
    ids = mx.array([[(i * 7919) % 40000 + 100 for i in range(context)]], dtype=mx.uint32)
    model(ids, cache=cache)
    mx.eval([c.state for c in cache])
    wall, cpu = {}, {}
    for n in sizes:
        walls, cpus = [], []
        for _ in range(repeats):
            t, c0 = time.perf_counter(), time.process_time()
            mx.eval(model(ids[:, :n], cache=cache))
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c0)
            for c in cache:
                c.trim(n)
        wall[n], cpu[n] = statistics.median(walls), statistics.median(cpus)
    return {"context": context, "wall_s": wall, "cpu_s": cpu,
            "wall_ratio": {n: wall[n] / wall[1] for n in sizes},
            "cpu_ratio": {n: cpu[n] / cpu[1] for n in sizes}}


def run_task(loaded, task: dict, drafts: dict, max_tokens: int) -> list[dict]:
    """Prefill the task once, then decode it in every mode from the same cache.

    Calls the same decode functions the engine calls (`generate.decode` for
    `off`, `speculative_decode` otherwise) on this thread, timing wall clock
    and process CPU time (the CPU is shared: CPU time is the steadier measure).
    """
    tok, model = loaded.tokenizer, loaded.model
    ids = tok.encode(tok.render_chat([{"role": "user", "content": task["message"]}]))
    eos = frozenset(tok.eos_token_ids)
    cache = make_cache(model)
    logits = prefill(model, cache, ids)
    rows = []
    for mode in MODES:
        metrics = Metrics()
        if mode == "off":
            steps = decode(model, cache, logits, greedy, max_tokens, eos)
        else:
            steps = speculative_decode(model, cache, logits, greedy, max_tokens, eos, prompt_ids=ids,
                                       mode=mode, draft=drafts.get(mode), metrics=metrics)
        wall, cpu = time.perf_counter(), time.process_time()
        tokens = list(steps)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        for c in cache:  # back to the prompt for the next mode
            c.trim(c.offset - len(ids))
        rows.append({"task": task["name"], "kind": task["kind"], "mode": mode,
                     "prompt_tokens": len(ids), "tokens": tokens, "decode_tokens": len(tokens),
                     "wall_s": wall, "cpu_s": cpu, "tps": len(tokens) / wall,
                     "cpu_tps": len(tokens) / cpu, "drafted": metrics.drafted_tokens,
                     "accepted": metrics.accepted_tokens, "acceptance": metrics.acceptance,
                     "text": tok.decode(tokens)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--draft-layers", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "bench/results/speculative.json"))
    args = parser.parse_args()

    loaded = load_model(progress=False)
    load_before = os.getloadavg()
    cost = verify_cost(loaded.model)
    draft_model = truncated_draft(loaded.model, args.draft_layers)
    draft_cost = verify_cost(draft_model, sizes=(1,), repeats=7)["cpu_s"][1]

    rows = []
    for task in tasks():
        drafts = {"draft": DraftModelDrafter(draft_model, k=4)}
        rows += run_task(loaded, task, drafts, args.max_tokens)
    base = {r["task"]: r for r in rows if r["mode"] == "off"}
    for r in rows:
        ref = base[r["task"]]
        r["identical"] = r["tokens"] == ref["tokens"]
        r["speedup"] = r["tps"] / ref["tps"]
        r["cpu_speedup"] = r["cpu_tps"] / ref["cpu_tps"]

    print(f"verify cost vs a 1-token forward (context {cost['context']}), wall / cpu: " + ", ".join(
        f"{n} tok {cost['wall_ratio'][n]:.2f}x / {cost['cpu_ratio'][n]:.2f}x" for n in cost["cpu_ratio"]))
    print(f"one-token forward CPU time: target {cost['cpu_s'][1] * 1000:.1f} ms, "
          f"{args.draft_layers}-layer draft {draft_cost * 1000:.1f} ms")
    print(f"{'task':18} {'mode':7} {'tok':>4} {'tok/s':>6} {'x wall':>6} {'x cpu':>6} "
          f"{'drafted':>7} {'accept':>6} {'same':>5}")
    for r in rows:
        print(f"{r['task']:18} {r['mode']:7} {r['decode_tokens']:4d} {r['tps']:6.2f} "
              f"{r['speedup']:6.2f} {r['cpu_speedup']:6.2f} {r['drafted']:7d} "
              f"{r['acceptance']:6.2f} {str(r['identical']):>5}")
    summary = {}
    for kind in ("edit", "free"):
        for mode in ("lookup", "draft", "auto"):
            sel = [r for r in rows if r["kind"] == kind and r["mode"] == mode]
            summary[f"{kind}/{mode}"] = {
                "wall": statistics.geometric_mean([r["speedup"] for r in sel]),
                "cpu": statistics.geometric_mean([r["cpu_speedup"] for r in sel]),
                "acceptance": sum(r["accepted"] for r in sel) / max(1, sum(r["drafted"] for r in sel)),
            }
    print("geometric-mean speedup vs off (wall / cpu): " + ", ".join(
        f"{k} {v['wall']:.2f}x / {v['cpu']:.2f}x" for k, v in summary.items()))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "model": loaded.model_id, "max_tokens": args.max_tokens, "draft_layers": args.draft_layers,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "verify_cost": cost, "draft_forward_s": draft_cost, "summary": summary,
        "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
