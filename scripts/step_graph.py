"""A traced decode step's operations, counted on the CPU: what each layer adds to a step's graph.

On MLX's CUDA backend each operation of a replayed step is a launch, about 3 µs even when tiny (the H200's
profile e, docs/benchmarks.md, twelfth session). This counts them without a GPU. Our CUDA kernels are recorded
(`tests/engine/cuda_compile.Recorder`), each launch returning zeros that depend on its inputs, so the graph
keeps every operation around them. The step is built as `bench/gpu_step.py` builds it (Qwen3-32B's heads,
a smaller width), traced (MLX's compile passes merge equal operations, as on the GPU) and read with
`mx.export_to_dot`, at two layer counts: the difference is one layer's operations.

The CPU's graph is not the GPU's in one respect: MLX's fast RMS norm is one operation on CUDA
(``rms_norm_small``) and several, partly fused, on the CPU. Reshapes, transposes and `Depends` are not
launches on either.

    .venv/bin/python scripts/step_graph.py --bits 8 --variant "ours+traced+fused"

Run it as a script, in a process of its own: it replaces MLX's `cuda_kernel` and `engine.cuda_backend.cuda_available`
for the process, before the engine's kernel modules are imported (they take the function's name at import).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "engine")]

import mlx.core as mx  # noqa: E402
from cuda_compile import Recorder, graph_operations, record_kernels  # noqa: E402

from engine import decode_kernels  # noqa: E402


class DependingRecorder(Recorder):
    """`Recorder`, each launch's zeros depending on its inputs (a `Depends` in the graph where the kernel is)."""

    def __call__(self, **definition):
        launch = super().__call__(**definition)

        def depending(**call):
            inputs = [a for a in call["inputs"] if isinstance(a, mx.array)]
            return mx.depends(launch(**call), inputs)
        return depending


def step_operations(layers: int, bits: int, variant: str, rows: int) -> collections.Counter:
    """The operations of one replayed one-token step over a `bits` cache of `rows` rows, by name."""
    from bench import gpu_step, prefill

    shape = prefill.SHAPES["qwen3-32b"]
    prefill.SHAPES["step-graph"] = dataclasses.replace(
        shape, args=dict(shape.args, hidden_size=1024, num_hidden_layers=layers, intermediate_size=2048,
                         vocab_size=1024), global_tokens=256, window_tokens=256, dense_tail=128)
    model, policy, path = gpu_step.step_model("step-graph")
    step = gpu_step.step_paths(model, path, "staged")[variant]
    cache = gpu_step.filled_cache(model, policy, bits, rows)
    token = mx.array([[7]], dtype=mx.uint32)
    with decode_kernels.scope(qmv=True, attention=bits == 8, staged=True, kv_write=bits == 8):
        mx.eval(step.forward(token, cache, logits="last"))  # traced here
        logits = step.forward(token, cache, logits="last")  # replayed
    traced = step.decode_step
    if traced is None or traced.traces != 1 or traced.fallbacks:
        raise SystemExit(f"{variant}: the step was not replayed from one trace here ({traced and traced.fallbacks} "
                         "fallbacks); its graph would not be the GPU's")
    return collections.Counter(graph_operations(logits))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, choices=(8, 16), default=8)
    ap.add_argument("--variant", default="ours+traced+fused", choices=("ours+traced", "ours+traced+fused"),
                    help="bench/gpu_step.py's traced step path (the engine traces nothing with MLX's kernels on CUDA)")
    ap.add_argument("--rows", type=int, default=1024, help="cache rows")
    a = ap.parse_args(argv)
    mx.set_default_device(mx.cpu)
    record_kernels((), DependingRecorder())
    two, three = (step_operations(n, a.bits, a.variant, a.rows) for n in (2, 3))
    per_layer = {name: three[name] - two[name] for name in sorted(three) if three[name] != two[name]}
    print(f"{a.variant}, {a.bits}-bit cache: operations a layer adds to the replayed step "
          "(Depends: our kernels and the cache write's ordering)")
    for name, count in sorted(per_layer.items(), key=lambda item: -item[1]):
        print(f"  {count:3d}  {name}")
    return {"variant": a.variant, "bits": a.bits, "per_layer": per_layer}


if __name__ == "__main__":
    main()
