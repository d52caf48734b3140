"""A prefill chunk's forward for its last logits: the LM head over the last row (`engine.last_row`) against the
head over every row (what MLX computed before: slicing the logits after the head does not shorten the product).

The default model (SmolLM2-135M, its head tied to the embeddings) on the MLX forward of this machine's device
(`ComputeOptions(forward="mlx")`: what a Mac or a GPU runs; the CPU build's NumPy forward has always taken the
last row alone), one forward over a fresh cache per timing, best of `--repeats`. The peer is the same forward
with the head over every row; the body alone (no head: ``logits="none"``) bounds what the head can save.

    python bench/last_row.py --rows 128,512     # table on stdout, JSON under bench/results/
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import blas_arguments, machine, markdown_table, preload_blas, write_json  # noqa: E402


def measure(rows: list[int], repeats: int) -> list[dict]:
    import mlx.core as mx

    from engine.compute import ComputeOptions, choose
    from engine.default_model import ensure_default_model
    from engine.kv import make_cache
    from engine.loading import load_model

    loaded = load_model(str(ensure_default_model(progress=False).directory), progress=False)
    model = loaded.model
    path = choose(model, ComputeOptions(attention="mlx", forward="mlx", compile=False))
    vocab = model.args.vocab_size

    def forward(tokens: mx.array, how: str) -> None:
        cache = make_cache(model)
        if how == "every row":
            out = path.call(tokens, cache)[:, -1:, :]
        else:
            out = path.forward(tokens, cache, logits="last" if how == "last row" else "none")
        mx.eval([out] if out is not None and how != "no head" else [], [c.state for c in cache])

    results = []
    for n in rows:
        tokens = mx.array([[(i * 7919) % (vocab - 10) + 10 for i in range(n)]])
        best = {}
        for how in ("last row", "every row", "no head"):
            forward(tokens, how)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                forward(tokens, how)
                times.append(time.perf_counter() - start)
            best[how] = min(times)
        results.append({"rows": n, "device": str(mx.default_device()), "seconds": {k: round(v, 4) for k, v in
                                                                                  best.items()},
                        "every_over_last": round(best["every row"] / best["last row"], 3),
                        "head_share_saved": round((best["every row"] - best["last row"]) / best["every row"], 3)})
    return results


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="128,512", help="rows of the chunk, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    blas_arguments(ap)
    a = ap.parse_args(argv)
    preload_blas(argv)
    results = measure([int(r) for r in a.rows.split(",")], a.repeats)
    print(markdown_table(["rows", "device", "last row s", "every row s", "no head s", "every/last", "saved"],
                         [[r["rows"], r["device"], r["seconds"]["last row"], r["seconds"]["every row"],
                           r["seconds"]["no head"], f"{r['every_over_last']}x", f"{r['head_share_saved']:.0%}"]
                          for r in results]))
    payload = {"machine": machine(), "model": "smollm2-135m", "results": results}
    print(f"wrote {write_json('last_row', payload)}")
    return payload


if __name__ == "__main__":
    main()
