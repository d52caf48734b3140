"""CPU attention: `engine.cpu_attention` (NumPy softmax) against MLX's own SDPA, same run.

Loads the model (default: the default model), fills a plain KV cache with a
`--context`-token prompt (through the NumPy path, timed: prefill tok/s), then
times one forward of n new tokens over that context for each n, with the
NumPy path (`engine.compute.choose` with ``forward: mlx``: the model's layers, NumPy
attention) and with the model's own MLX attention, alternating, and reports medians, their ratio and the largest logit difference.
Also times the context prefill itself under MLX attention unless --skip-mlx-prefill,
and `exp` alone over one layer's scores (MLX vs NumPy).

    python bench/cpu_attention.py [--context 4200] [--sizes 1,6,32,512] [--repeats 3] [--blas auto]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import preload_blas  # noqa: E402

preload_blas()  # before MLX is imported

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

from bench._common import blas_arguments, machine, markdown_table, write_json  # noqa: E402
from engine.compute import ComputeOptions, choose  # noqa: E402
from engine.loading import load_model  # noqa: E402

CHUNK = 512


def prefill(call, model, ids: mx.array, n: int) -> tuple[list[KVCache], float]:
    cache = [KVCache() for _ in model.layers]
    started = time.perf_counter()
    for start in range(0, n, CHUNK):
        call(ids[:, start:min(n, start + CHUNK)], cache)
        mx.eval([c.state for c in cache])
    return cache, time.perf_counter() - started


def forward_ms(call, cache: list[KVCache], tokens: mx.array) -> tuple[float, mx.array]:
    started = time.perf_counter()
    logits = call(tokens, cache)
    mx.eval(logits)
    elapsed = time.perf_counter() - started
    for c in cache:
        c.trim(tokens.shape[1])
    return 1000 * elapsed, logits


def exp_ms(repeats: int = 50) -> tuple[float, float]:
    """`exp` of the scores of 6 queries x 9 heads over 4,200 keys (one layer): MLX vs NumPy, ms."""
    scores = mx.random.normal((1, 3, 18, 4200))
    mx.eval(scores)
    array = np.asarray(scores)
    mx.eval(mx.exp(scores))
    started = time.perf_counter()
    for _ in range(repeats):
        mx.eval(mx.exp(scores))
    mlx_ms = 1000 * (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        np.exp(array)
    return mlx_ms, 1000 * (time.perf_counter() - started) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model name or path (default: the default model)")
    parser.add_argument("--context", type=int, default=4200)
    parser.add_argument("--sizes", default="1,6,32,512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-mlx-prefill", action="store_true")
    blas_arguments(parser)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    loaded = load_model(args.model, progress=False)
    model = loaded.model
    path = choose(model, ComputeOptions(forward="mlx", blas_threads=args.blas_threads))
    if path.attention != "numpy":
        print(f"engine.cpu_attention does not apply here: {'; '.join(path.notes)}")
        return 1

    def mlx_call(tokens: mx.array, cache: list) -> mx.array:
        return model(tokens, cache=cache)

    vocab = model.args.vocab_size
    ids = mx.array([[(i * 7919) % (vocab - 200) + 100 for i in range(args.context + max(sizes))]])
    cache, numpy_prefill_s = prefill(path.call, model, ids, args.context)
    mlx_prefill_s = None
    if not args.skip_mlx_prefill:
        _, mlx_prefill_s = prefill(mlx_call, model, ids, args.context)
    rows, table = [], []
    for n in sizes:
        tokens = ids[:, args.context:args.context + n]
        times = {"numpy": [], "mlx": []}
        diff = 0.0
        for _ in range(args.repeats):
            ms, ours = forward_ms(path.call, cache, tokens)
            times["numpy"].append(ms)
            ms, theirs = forward_ms(mlx_call, cache, tokens)
            times["mlx"].append(ms)
            diff = max(diff, mx.abs(ours - theirs).max().item())
        numpy_ms, mlx_ms = statistics.median(times["numpy"]), statistics.median(times["mlx"])
        rows.append({"new_tokens": n, "numpy_ms": numpy_ms, "mlx_ms": mlx_ms, "speedup": mlx_ms / numpy_ms,
                     "max_logit_diff": diff, "samples": times})
        table.append([n, numpy_ms, mlx_ms, f"{mlx_ms / numpy_ms:.2f}x", f"{diff:.1e}"])
    print(f"model {loaded.model_id}, context {args.context} tokens, {args.repeats} repeats (median)")
    print(markdown_table(["new tokens", "NumPy attention ms", "MLX attention ms", "speedup", "max |Δlogit|"], table))
    line = f"prefill of the {args.context}-token context (chunks of {CHUNK}): NumPy {args.context / numpy_prefill_s:.0f} tok/s"
    if mlx_prefill_s is not None:
        line += f", MLX {args.context / mlx_prefill_s:.0f} tok/s ({mlx_prefill_s / numpy_prefill_s:.2f}x)"
    print(line)
    mlx_exp, numpy_exp = exp_ms()
    print(f"exp of 226,800 scores: MLX {mlx_exp:.2f} ms, NumPy {numpy_exp:.2f} ms ({mlx_exp / numpy_exp:.0f}x)")
    result = {"machine": machine(), "args": vars(args), "model": loaded.model_id, "rows": rows,
              "prefill_s": {"numpy": numpy_prefill_s, "mlx": mlx_prefill_s},
              "exp_ms": {"mlx": mlx_exp, "numpy": numpy_exp}}
    print(f"wrote {write_json('cpu_attention', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
