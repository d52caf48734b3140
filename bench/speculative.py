"""Benchmark of speculative decoding on the default model: off / lookup / draft / auto.

Tasks: three edit-style requests over real code from this repository (add a
docstring to a function, rename an attribute across a class, comment every line
of a function), each answered after a response header that opens a code block
(the answer is the given code, edited), and two free-form questions. Each task is prefilled once and
decoded once per mode with the engine's decode functions; decode tok/s, drafted/accepted tokens and whether the
greedy output is identical to mode `off` are recorded.

The draft model is the target's first `--draft-layers` layers with its own
final norm and head (a layer-skip self-draft): SmolLM2-135M has no smaller
sibling with the same tokenizer, and this one shares every weight.

It also measures the verification cost that `auto` mode's break-even uses:
the time of one target forward over n tokens against a one-token forward.

    python bench/speculative.py [--max-tokens 64] [--draft-layers 8] [--draft-k 4] [--blas-threads 0]
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

from bench._common import blas_arguments, preload_blas  # noqa: E402

preload_blas()  # before MLX is imported

from engine.compute import ComputeOptions, choose  # noqa: E402
from engine.draft_model import DraftModelDrafter  # noqa: E402
from engine.generate import decode, prefill  # noqa: E402
from engine.lookup import PromptLookupDrafter  # noqa: E402
from engine.kv import make_cache  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.request import Metrics  # noqa: E402
from engine.sampling import greedy  # noqa: E402
from engine.speculative_decode import speculative_decode  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402


def _function_source(path: str, name: str) -> str:
    text = (ROOT / path).read_text()
    start = text.index(f"{name}")
    start = text.rindex("\n", 0, start) + 1
    ends = [e for e in (text.find("\ndef ", start + 1), text.find("\nclass ", start + 1)) if e > 0]
    return text[start : min(ends) if ends else len(text)].rstrip() + "\n"


MODES = ("off", "lookup", "draft", "auto")


CODE_HEADER = "```python\n"
"""Response header of the edit tasks: the answer starts inside a code block."""


def tasks() -> list[dict]:
    """(name, kind, user message, response header) of every task."""
    spans = _function_source("engine/generate.py", "def chunk_spans(")
    spans_bare = spans.split('"""')[0] + spans.split('"""')[2].lstrip("\n")
    stops = _function_source("engine/generate.py", "class StopStrings")
    verify = _function_source("engine/speculative.py", "def verify_greedy(")
    reply = "Reply with the whole {} in one code block."
    return [
        {"name": "add-docstring", "kind": "edit", "header": CODE_HEADER,
         "message": "Add a Google-style docstring to this function. " + reply.format("function")
                    + f"\n\n```python\n{spans_bare}```"},
        {"name": "rename-attribute", "kind": "edit", "header": CODE_HEADER,
         "message": "Rename `_pending` to `_buffer` everywhere in this class. "
                    + reply.format("class") + f"\n\n```python\n{stops}```"},
        {"name": "comment-lines", "kind": "edit", "header": CODE_HEADER,
         "message": "Add a comment above each line of this function saying what the line does. "
                    + reply.format("function") + f"\n\n```python\n{verify}```"},
        {"name": "free-capital", "kind": "free", "header": "",
         "message": "Tell me about the history of Paris in a few paragraphs."},
        {"name": "free-advice", "kind": "free", "header": "",
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
    """Median wall and CPU seconds of one forward over n new tokens after `context` cached ones.

    The forward is `ComputePath.verify` of the engine's default path, as in
    decoding (on the CPU: the NumPy forward for llama models, else the compiled
    steps); `plain_*` is the model's own uncompiled MLX call.
    """
    cache = make_prompt_cache(model)
    ids = mx.array([[(i * 7919) % 40000 + 100 for i in range(context)]], dtype=mx.uint32)
    model(ids, cache=cache)
    mx.eval([c.state for c in cache])
    path = choose(model, ComputeOptions())
    calls = {"": lambda x: path.verify(x, cache), "plain_": lambda x: model(x, cache=cache)}
    out: dict = {"context": context}
    for prefix, call in calls.items():
        wall, cpu = {}, {}
        for n in sizes:
            walls, cpus = [], []
            for i in range(repeats + 1):
                t, c0 = time.perf_counter(), time.process_time()
                mx.eval(mx.argmax(call(ids[:, :n])[0], axis=-1))
                if i:  # the first call traces
                    walls.append(time.perf_counter() - t)
                    cpus.append(time.process_time() - c0)
                for c in cache:
                    c.trim(n)
            wall[n], cpu[n] = statistics.median(walls), statistics.median(cpus)
        out.update({f"{prefix}wall_s": wall, f"{prefix}cpu_s": cpu,
                    f"{prefix}wall_ratio": {n: wall[n] / wall[1] for n in sizes},
                    f"{prefix}cpu_ratio": {n: cpu[n] / cpu[1] for n in sizes}})
    return out


def lookup_draft_s(ids: list[int], steps: int = 64) -> float:
    """Mean seconds of one prompt-lookup draft while the history grows by one token."""
    drafter, history = PromptLookupDrafter(), list(ids)
    drafter.draft(history)
    start = time.perf_counter()
    for i in range(steps):
        history.append(history[i])
        drafter.draft(history)
    return (time.perf_counter() - start) / steps


def run_task(loaded, task: dict, drafts: dict, max_tokens: int) -> list[dict]:
    """Prefill the task once, then decode it in every mode from the same cache.

    Calls the same decode functions the engine calls (`generate.decode` for
    `off`, `speculative_decode` otherwise) on this thread, timing wall clock
    and process CPU time (the CPU is shared: CPU time is the steadier measure).
    """
    tok, model = loaded.tokenizer, loaded.model
    path = choose(model, ComputeOptions())  # the path an engine with default options runs
    ids = tok.encode(tok.render_chat([{"role": "user", "content": task["message"]}]) + task["header"])
    eos = frozenset(tok.eos_token_ids)
    cache = make_cache(model)
    logits = prefill(path, cache, ids)
    rows = []
    for mode in MODES:
        metrics = Metrics()
        if mode == "off":
            steps = decode(path, cache, logits, greedy, max_tokens, eos)
        else:
            steps = speculative_decode(path, cache, logits, greedy, max_tokens, eos, prompt_ids=ids,
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
                     # Every round emits its accepted drafts + 1; the first token is the prefill's.
                     "tokens_per_forward": (len(tokens) - 1)
                     / max(1, len(tokens) - 1 - metrics.accepted_tokens),
                     "text": tok.decode(tokens)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--draft-layers", type=int, default=8)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--out", default=str(ROOT / "bench/results/speculative.json"))
    blas_arguments(parser)
    args = parser.parse_args()

    loaded = load_model(progress=False)
    load_before = os.getloadavg()
    cost = verify_cost(loaded.model)
    draft_model = truncated_draft(loaded.model, args.draft_layers)
    draft_cost = verify_cost(draft_model, sizes=(1,), repeats=7)["cpu_s"][1]
    lookup_s = lookup_draft_s(list(range(2000)))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for task in tasks():
        drafts = {"draft": DraftModelDrafter(draft_model, k=args.draft_k)}
        rows += run_task(loaded, task, drafts, args.max_tokens)
        summary = compare(rows)
        out.write_text(json.dumps({  # after every task: a cut-short run still reports
            "model": loaded.model_id, "max_tokens": args.max_tokens,
            "draft_layers": args.draft_layers, "draft_k": args.draft_k,
            "lookup_draft_s": lookup_s, "argv": sys.argv[1:],
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "verify_cost": cost, "draft_forward_s": draft_cost, "summary": summary,
            "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
        }, indent=2))
        print(f"{task['name']} done", flush=True)

    print(f"verify cost vs a 1-token forward (context {cost['context']}), wall / cpu: " + ", ".join(
        f"{n} tok {cost['wall_ratio'][n]:.2f}x / {cost['cpu_ratio'][n]:.2f}x" for n in cost["cpu_ratio"]))
    print("uncompiled, wall / cpu: " + ", ".join(
        f"{n} tok {cost['plain_wall_ratio'][n]:.2f}x / {cost['plain_cpu_ratio'][n]:.2f}x"
        for n in cost["plain_cpu_ratio"]))
    print(f"one-token forward CPU time: target {cost['cpu_s'][1] * 1000:.1f} ms compiled, "
          f"{cost['plain_cpu_s'][1] * 1000:.1f} ms plain; {args.draft_layers}-layer draft "
          f"{draft_cost * 1000:.1f} ms; one lookup draft {lookup_s * 1e6:.0f} us")
    print(f"{'task':18} {'mode':7} {'tok':>4} {'tok/s':>6} {'x wall':>6} {'x cpu':>6} "
          f"{'drafted':>7} {'accept':>6} {'tok/fwd':>7} {'same':>5}")
    for r in rows:
        print(f"{r['task']:18} {r['mode']:7} {r['decode_tokens']:4d} {r['tps']:6.2f} "
              f"{r['speedup']:6.2f} {r['cpu_speedup']:6.2f} {r['drafted']:7d} "
              f"{r['acceptance']:6.2f} {r['tokens_per_forward']:7.2f} {str(r['identical']):>5}")
    print("geometric-mean speedup vs off (wall / cpu): " + ", ".join(
        f"{k} {v['wall']:.2f}x / {v['cpu']:.2f}x" for k, v in summary.items()))
    print(f"wrote {out}")


def compare(rows: list[dict]) -> dict:
    """Add identity and speedups vs `off` to each row; geometric means per kind and mode."""
    base = {r["task"]: r for r in rows if r["mode"] == "off"}
    for r in rows:
        ref = base[r["task"]]
        r["identical"] = r["tokens"] == ref["tokens"]
        r["speedup"] = r["tps"] / ref["tps"]
        r["cpu_speedup"] = r["cpu_tps"] / ref["cpu_tps"]
    summary = {}
    for kind in ("edit", "free"):
        for mode in ("lookup", "draft", "auto"):
            sel = [r for r in rows if r["kind"] == kind and r["mode"] == mode]
            if sel:
                summary[f"{kind}/{mode}"] = {
                    "wall": statistics.geometric_mean([r["speedup"] for r in sel]),
                    "cpu": statistics.geometric_mean([r["cpu_speedup"] for r in sel]),
                    "acceptance": sum(r["accepted"] for r in sel)
                    / max(1, sum(r["drafted"] for r in sel)),
                    "tokens_per_forward": statistics.mean(r["tokens_per_forward"] for r in sel),
                }
    return summary


if __name__ == "__main__":
    main()
