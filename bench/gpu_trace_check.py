"""Where the 8-bit traced decode step parts from the plain step (a diagnostic for MLX's CUDA backend).

The load-time check of ``step_traced`` (`engine.step_measure.check_traced_step`) failed with the same relative
error, 4.86e-2 on the step's logits, on the H200 (run h) and on the H100 (run i), after the plain step it is held
to split its keys as the trace does. (The repeat to three digits says little: both cards have 132 SMs, so the
same launches and the same order of every float sum.) This runs the check's three one-token steps over a random
Qwen3-32B-shaped model's filled 8-bit caches, four ways from equal caches, and prints each step's relative error of
the logits and of every layer's written row:

- ``plain``: the check's reference before the fix (94586d4): the kernels' scope, its MLPs compiled apart, the keys
  split as traced;
- ``eager``: the trace's own function (`CompiledDecodeStep._trace`: the stand-in caches, the count and position as
  arrays, the traced scope) run without `mx.compile`;
- ``traced``: the same replayed from its trace, as the engine runs it;
- ``mlx``: the plain step on MLX's kernels alone: how far two sound implementations drift on this model.

eager against plain isolates the stand-ins and the traced scope; traced against eager isolates the compilation.
Each variant turns one of the kernels off (the rest as the engine chose them on the H200), at each row count.

    # device tool, carry [".gpu"]:
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_trace_check.py --layers 64 --out $OUT/gpu_trace_check.json
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()

import mlx.core as mx  # noqa: E402

from bench.prefill import SHAPES, build_model  # noqa: E402
from engine import decode_kernels  # noqa: E402
from engine.compiled import CompiledDecodeStep  # noqa: E402
from engine.decode_choice import DecodeKernels  # noqa: E402
from engine.decode_measure import compute_dtype  # noqa: E402
from engine.step_measure import filled_cache  # noqa: E402
from engine.window import WindowPolicy  # noqa: E402

CHOSEN = DecodeKernels(source="setting", qmv=True, attention_transposed=True, attention_chunk=True, kv_write=True,
                       mlp_compiled=True, qmv_fused=True, rope_fused=True, residual_fused=True,
                       attention_chunk_q8=True, step_traced=True)
"""What the engine ran on the H200 in run h, the 8-bit trace added."""
OFF = {"none": {}, "residual_fused": {"residual_fused": False}, "rope_fused": {"rope_fused": False},
       "qmv_fused": {"qmv_fused": False}, "mlp_compiled": {"mlp_compiled": False},
       "transposed->staged": {"attention_transposed": False, "attention_staged": True},
       "qmv": {"qmv": False, "qmv_fused": False, "mlp_compiled": False, "residual_fused": False}}


def rel(a: mx.array, b: mx.array) -> float:
    a, b = a.astype(mx.float32), b.astype(mx.float32)
    return float(mx.linalg.norm((a - b).flatten()) / mx.maximum(mx.linalg.norm(b.flatten()), 1e-30))


def one(model, kernels: DecodeKernels, rows: int, steps: int) -> dict:
    """The four ways' errors over `steps` steps from equal caches of `rows` rows."""
    def plain(tokens, cache):
        with kernels.scope(tokens.size), decode_kernels.split_as_traced():
            return model(tokens, cache=cache)

    inside = lambda n: kernels.scope(n, traced=True)  # noqa: E731
    traced = CompiledDecodeStep(model, 1, fallback=plain, scope=inside, ours=frozenset({"q8"}))
    eager = CompiledDecodeStep(model, 1, fallback=plain, scope=inside, ours=frozenset({"q8"}))
    eager._compiled = eager._trace  # the trace's function, run as it is
    def mlx(tokens, cache):  # MLX's kernels only: how far two sound implementations drift on this model
        return model(tokens, cache=cache)

    caches = [filled_cache(model, WindowPolicy(enabled=False), 8, rows, compute_dtype(model)) for _ in range(4)]
    token, out = mx.array([[1]], dtype=mx.uint32), []
    for step in range(steps):
        at = caches[0][0].offset
        logits = [f(token, c) for f, c in zip((plain, eager, traced, mlx), caches)]
        mx.eval(logits)
        written = [[c.store.read(at, at + 1) for c in cache] for cache in caches]
        worst_row = {name: max(rel(x, y) for ours, ref in zip(written[i], written[0]) for x, y in zip(ours, ref))
                     for i, name in ((1, "eager"), (2, "traced"))}
        out.append({"step": step, "eager_vs_plain": rel(logits[1], logits[0]),
                    "traced_vs_plain": rel(logits[2], logits[0]), "traced_vs_eager": rel(logits[2], logits[1]),
                    "plain_vs_mlx": rel(logits[0], logits[3]),
                    "row_eager_vs_plain": worst_row["eager"], "row_traced_vs_plain": worst_row["traced"],
                    "fallbacks": [eager.fallbacks, traced.fallbacks]})
        token = mx.argmax(logits[0][:, -1, :], axis=-1).reshape(1, 1)
    caches = None
    mx.clear_cache()
    return {"rows": rows, "steps": out}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rows", default="992,8160")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variants", default=",".join(OFF))
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    started = time.perf_counter()
    model = build_model(SHAPES["qwen3-32b"], a.layers)
    CHOSEN.wire(model)
    result = {"mlx": mx.__version__, "device": str(mx.default_device()), "layers": a.layers, "runs": []}
    for variant in a.variants.split(","):
        kernels = dataclasses.replace(CHOSEN, **OFF[variant])
        for rows in (int(r) for r in a.rows.split(",")):
            try:
                run = {"off": variant, **one(model, kernels, rows, a.steps)}
            except Exception as err:  # noqa: BLE001 - a diagnostic: say what failed, go on
                run = {"off": variant, "rows": rows, "error": repr(err)}
            result["runs"].append(run)
            first = run.get("steps", [{}])[0]
            print(variant, rows, run.get("error") or {k: (round(v, 5) if isinstance(v, float) else v)
                                                      for k, v in first.items()}, flush=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    if a.out:
        from bench._common import save_json

        save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
