"""CPU forward: `engine.cpu_forward` (layers in NumPy) against the model's MLX call, same run.

Loads the model (default: the default model), fills a plain KV cache with a
`--context`-token prompt through the NumPy forward (timed: prefill tok/s, in
the engine's 256-token chunks), then times one forward of n new tokens over
that context for each n, three ways (each way's calls in a row, after one untimed call):

* ``numpy-forward``: `engine.cpu_forward.NumpyForward` (what the engine runs on the CPU);
* ``mlx+numpy-attention``: the model's own call with `engine.cpu_attention`
  (the ``compute.forward: mlx`` path);
* ``mlx``: the model's own call, MLX end to end (``compute.attention: mlx``; plain mlx-lm).

The paths are the ones `engine.compute.choose` builds for the engine.

Each forward asks for the last position's logits only, as prefill and decode
do. Reports medians, ratios and the largest logit difference against ``mlx``.
Also measures one-row matmuls over the model's own weights (MLX vs NumPy, GB/s),
and times the context prefill with the model's call and NumPy attention
(``--mlx-prefill`` adds MLX end to end, ~2 min at 4,200 tokens).

With ``--kv-bits 8`` the cache is the engine's 8-bit one (`QuantizedWindowKVCache`,
window off): the NumPy paths dequantize the history, ``mlx`` attends over it
with `quantized_matmul` for up to 32 new tokens.

    python bench/cpu_forward.py [--context 4200] [--sizes 1,7,32,256] [--repeats 3] [--kv-bits 16]
                                [--blas auto] [--blas-threads 0]
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
from mlx_lm.models.cache import KVCache  # noqa: E402

from bench._common import blas_arguments, cpu_ticks, machine, markdown_table, steal_share, write_json  # noqa: E402
from engine import blas, cpu_attention  # noqa: E402
from engine.compute import ComputeOptions, ComputePath, choose  # noqa: E402
from engine.generate import DEFAULT_PREFILL_CHUNK  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.window import WindowPolicy, make_window_cache  # noqa: E402

WAYS = ("numpy-forward", "mlx+numpy-attention", "mlx")


def run(way: str, path: ComputePath, tokens: mx.array, cache: list) -> mx.array:
    """One forward the given way; logits of the last position, evaluated."""
    # Each path sets NumPy's BLAS threads itself (cpu_attention.use_numpy_threads).
    if way == "numpy-forward":
        logits = path.numpy_forward(tokens, cache, logits="last")
    elif way == "mlx":
        logits = path.model(tokens, cache=cache)[:, -1:]
    else:
        logits = path.call(tokens, cache)[:, -1:]
    mx.eval(logits, [c.state for c in cache])
    return logits


def matmul_gbps(model, threads: int, repeats: int = 5) -> tuple[float, float]:
    """One-row matmuls over every layer's projection and MLP weights: MLX vs NumPy, GB/s of weights.

    The weights are the model's own (a few hundred MB, so they stream from memory
    as in a forward); NumPy runs with the thread count the NumPy forward uses.
    """
    weights = [lin.weight for block in model.model.layers
               for lin in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj,
                           block.self_attn.o_proj, block.mlp.gate_proj, block.mlp.up_proj, block.mlp.down_proj)]
    arrays = [cpu_attention.as_numpy(w) for w in weights]
    rows = {w.shape[1]: mx.random.normal((1, w.shape[1])) for w in weights}
    mx.eval(list(rows.values()))
    vectors = {d: cpu_attention.as_numpy(x)[0] for d, x in rows.items()}
    total = sum(a.nbytes for a in arrays) / 1e9

    def best(run) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return total / min(times)

    mlx = best(lambda: mx.eval([rows[w.shape[1]] @ w.T for w in weights]))
    cpu_attention.use_numpy_threads(threads)
    numpy = best(lambda: [a @ vectors[a.shape[1]] for a in arrays])
    return mlx, numpy


def new_cache(model, kv_bits: int) -> list:
    if kv_bits == 16:
        return [KVCache() for _ in model.layers]
    return make_window_cache(model, WindowPolicy(enabled=False), kv_bits=kv_bits)


def prefill_s(way: str, path: ComputePath, ids: mx.array, n: int, kv_bits: int) -> tuple[list, float]:
    cache = new_cache(path.model, kv_bits)
    started = time.perf_counter()
    for start in range(0, n, DEFAULT_PREFILL_CHUNK):
        run(way, path, ids[:, start:min(n, start + DEFAULT_PREFILL_CHUNK)], cache)
    return cache, time.perf_counter() - started


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model name or path (default: the default model)")
    parser.add_argument("--context", type=int, default=4200)
    parser.add_argument("--sizes", default="1,7,32,256")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-bits", type=int, default=16, choices=(8, 16))
    parser.add_argument("--mlx-prefill", action="store_true", help="also prefill the context MLX end to end")
    blas_arguments(parser)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    loaded = load_model(args.model, progress=False)
    model = loaded.model
    path = choose(model, ComputeOptions(blas_threads=args.blas_threads))
    if path.kind != "numpy-forward":
        print(f"engine.cpu_forward does not apply here: {'; '.join(path.notes)}")
        return 1
    threads = path.numpy_forward.threads
    ticks = cpu_ticks()
    vocab = model.args.vocab_size
    ids = mx.array([[(i * 7919) % (vocab - 200) + 100 for i in range(args.context + max(sizes))]])
    prefill = {}
    cache, prefill["numpy-forward"] = prefill_s("numpy-forward", path, ids, args.context, args.kv_bits)
    _, prefill["mlx+numpy-attention"] = prefill_s("mlx+numpy-attention", path, ids, args.context, args.kv_bits)
    if args.mlx_prefill:
        _, prefill["mlx"] = prefill_s("mlx", path, ids, args.context, args.kv_bits)
    rows, table = [], []
    for n in sizes:
        tokens = ids[:, args.context:args.context + n]
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        logits = {}
        for way in WAYS:  # one way at a time: a way's BLAS pool would spin into the next one's time
            for repeat in range(args.repeats + 1):
                started = time.perf_counter()
                logits[way] = run(way, path, tokens, cache)
                if repeat:  # the first call of a way warms its threads up
                    times[way].append(1000 * (time.perf_counter() - started))
                for c in cache:
                    c.trim(n)
        diff = mx.abs(logits["numpy-forward"] - logits["mlx"]).max().item()
        ms = {way: statistics.median(times[way]) for way in WAYS}
        rows.append({"new_tokens": n, "ms": ms, "max_logit_diff_vs_mlx": diff, "samples": times})
        table.append([n, ms["numpy-forward"], ms["mlx+numpy-attention"], ms["mlx"],
                      f"{ms['mlx+numpy-attention'] / ms['numpy-forward']:.2f}x",
                      f"{ms['mlx'] / ms['numpy-forward']:.2f}x", f"{diff:.1e}"])
    print(f"model {loaded.model_id}, context {args.context} tokens, {args.repeats} repeats (median), "
          f"{threads} BLAS threads, {args.kv_bits}-bit KV, BLAS {blas.in_use()}")
    print(markdown_table(["new tokens", "NumPy forward ms", "MLX + NumPy attention ms", "MLX ms",
                          "vs MLX + NumPy attention", "vs MLX", "max |Δlogit| vs MLX"], table))
    print(f"prefill of the {args.context}-token context (chunks of {DEFAULT_PREFILL_CHUNK}): " + ", ".join(
        f"{way} {args.context / s:.0f} tok/s" for way, s in prefill.items()))
    mlx_gbps, numpy_gbps = matmul_gbps(model, threads)
    print(f"one-row matmuls over all layers' weights: MLX {mlx_gbps:.1f} GB/s, NumPy {numpy_gbps:.1f} GB/s")
    steal = steal_share(ticks, cpu_ticks())
    if steal is not None:
        print(f"CPU time taken by the hypervisor (steal) during the run: {100 * steal:.0f}%")
    result = {"machine": machine(), "args": vars(args), "model": loaded.model_id, "rows": rows,
              "prefill_s": prefill, "blas_threads": threads, "compute": path.describe(), "cpu_steal": steal,
              "one_row_matmul_gbps": {"mlx": mlx_gbps, "numpy": numpy_gbps}}
    print(f"wrote {write_json('cpu_forward', result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
