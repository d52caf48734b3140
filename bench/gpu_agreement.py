"""Greedy tokens of one prompt through pairs of engines: a linear-mode difference told from run-to-run differences.

`linear_agreement` (here; `bench/gpu_engine.py` runs it) compares greedy tokens and last logits between
``compute.linear: quantized`` and ``dequantized``. When they differ, this script says whether two engines of the
*same* settings differ too (the decode path is then not deterministic), and whether MLX's kernels alone
(``compute.kernels: mlx``) agree: for each kernels setting, three engines in turn over bench/prefill.py's random
Qwen3-32B-shaped model cut to `--layers` layers (quantized, quantized again, dequantized), `--tokens` greedy tokens
each, and where their tokens first differ.

    # device tool, carry [".gpu"]:
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_agreement.py --out $OUT/gpu_agreement.json
    python bench/gpu_agreement.py --shape tiny --layers 2 --prompt 256 --tokens 8   # CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402

from bench.gpu_workload import random_loaded  # noqa: E402
from bench.prefill import SHAPES  # noqa: E402
from engine.compute import choose  # noqa: E402
from engine.compute_options import ComputeOptions  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.kv import make_cache  # noqa: E402
from engine.request import Request, TokenEvent  # noqa: E402


def greedy(loaded: Any, ids: list[int], tokens: int, linear: str, kernels: str = "auto",
           chunk: int = 2048) -> dict[str, Any]:
    """One engine's greedy tokens for `ids` (prefill chunks of `chunk`), and what its compute path ran."""
    with Engine(loaded, prefill_chunk=chunk, compute=ComputeOptions(linear=linear, kernels=kernels)) as eng:
        handle = eng.submit(Request(prompt_ids=ids, max_tokens=tokens))
        out = [t for e in handle if isinstance(e, TokenEvent) for t in e.token_ids]
        return {"linear": linear, "kernels": kernels, "tokens": out, "path": eng.compute.identity()}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _last_logits(model: Any, mode: str, ids: list[int], split: int = 0) -> mx.array:
    """Last-position logits of `ids` under the linear `mode`, prefilled in one call (or two, at `split`)."""
    path, cache = choose(model, ComputeOptions(linear=mode)), make_cache(model)
    if split:
        path.forward(mx.array([ids[:split]]), cache, logits="none")
    return path.forward(mx.array([ids[split:]]), cache, logits="last")[0, -1].astype(mx.float32)


def linear_agreement(shape: Any, shape_name: str, chunk: int, layers: int, prompt_tokens: int,
                     max_tokens: int) -> dict[str, Any]:
    """Greedy tokens and last-position logits of one prompt, quantized vs dequantized linears, on a
    `layers`-layer model of `shape`'s widths, prefilled in chunks of `chunk` (deep random models forget their
    input: the logits of another prompt are compared too, to show the check sees the input); `bench/gpu_engine.py`
    runs it once per run. A second quantized engine says whether the same settings give the same tokens
    (``repeat_first_difference``: None when they do), and ``paths`` what each engine's compute path ran: on H100s
    the modes' tokens differed at token 3 in four runs of ten, their prompt logits equal (docs/benchmarks.md)."""
    loaded = random_loaded(shape, f"{shape_name}-{layers}l", layers, 8192)
    vocab = loaded.model.args.vocab_size
    ids, other = ([int(t) for t in mx.random.randint(256, vocab - 16, (prompt_tokens,), key=mx.random.key(k)).tolist()]
                  for k in (5, 6))
    runs = {name: greedy(loaded, ids, max_tokens, name.split()[0], chunk=chunk)
            for name in ("quantized", "quantized again", "dequantized")}
    tokens = {name: run["tokens"] for name, run in runs.items()}
    q, d = _last_logits(loaded.model, "quantized", ids), _last_logits(loaded.model, "dequantized", ids)
    chunked = _last_logits(loaded.model, "quantized", ids, prompt_tokens // 2)
    elsewhere = _last_logits(loaded.model, "quantized", other)
    top2 = mx.sort(q)[-2:]
    diff = first_difference(tokens["quantized"], tokens["dequantized"])
    return dict(layers=layers, prompt_tokens=prompt_tokens, greedy_tokens=len(tokens["quantized"]),
                greedy_identical=tokens["quantized"] == tokens["dequantized"], first_difference=diff,
                repeat_first_difference=first_difference(tokens["quantized"], tokens["quantized again"]),
                paths={name: run["path"] for name, run in runs.items()},
                distinct_greedy_tokens=len(set(tokens["quantized"])),
                max_abs_logit_diff=round(mx.abs(q - d).max().item(), 5),
                chunking_max_abs_logit_diff=round(mx.abs(q - chunked).max().item(), 5),
                other_prompt_max_abs_logit_diff=round(mx.abs(q - elsewhere).max().item(), 5),
                top2_margin=round((top2[1] - top2[0]).item(), 5), logit_std=round(mx.std(q).item(), 4),
                argmax_equal=int(q.argmax().item()) == int(d.argmax().item()))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-32b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    loaded = random_loaded(SHAPES[a.shape], f"{a.shape}-{a.layers}l", a.layers, 8192)
    vocab = loaded.model.args.vocab_size
    ids = [int(t) for t in mx.random.randint(256, vocab - 16, (a.prompt,), key=mx.random.key(5)).tolist()]
    result: dict[str, Any] = {"device": str(mx.default_device()), "mlx": mx.__version__, "runs": []}
    for kernels in ("auto", "mlx"):
        runs = [greedy(loaded, ids, a.tokens, linear, kernels) for linear in ("quantized", "quantized", "dequantized")]
        result["runs"] += runs
        same, modes = (first_difference(runs[0]["tokens"], runs[i]["tokens"]) for i in (1, 2))
        print(f"kernels={kernels}: quantized twice first differ at {same}; quantized vs dequantized at {modes} "
              f"({runs[0]['path']})", flush=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
