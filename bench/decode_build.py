"""The host's cost of building one decode step, measured on a machine without the GPU.

On the H200 the engine's decode is the host's work: building a step's graph in Python, then
submitting it (docs/benchmarks.md, *GPU engine*, eighth session). Building it does not need
the GPU. This script builds the step of a 64-layer Qwen3-32B-shaped model, 4-bit, with the
widths cut down (the Python work per layer is the same). It uses the compute path the engine
takes on CUDA: our quantized linears, and for an 8-bit cache our tensor-core attention and
in-place write. It times the building only; nothing is evaluated.

MLX's CUDA backend is not here, so its kernel call is replaced by a stand-in. This is a fake of a
thing we do not own and cannot run here: `mx.fast.cuda_kernel` returns lazy zeros of the
declared outputs. The CUDA checks are forced on. The stand-in costs one MLX operation where the
real kernel costs one, so only the Python around the kernels, and MLX's building of the other
operations, is measured. Variants, each against ``mlx`` (MLX's own kernels, the same model) in
the same run:

- ``ours``: the engine's path on CUDA without `engine.compiled_mlp`;
- ``ours+compiled-mlp``: with it, each block's MLP replayed from its trace (the engine takes it
  where it measured it faster at load; whether MLX traces our CUDA kernels is not known here).

    python bench/decode_build.py --out /tmp/decode_build.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402

from bench._common import machine, markdown_table, save_json  # noqa: E402

VARIANTS = ("mlx", "ours", "ours+compiled-mlp")


def emulate_cuda() -> None:
    """Force the CUDA checks on and replace MLX's kernel call by lazy zeros (see the module docstring)."""
    from engine import cuda_attention, cuda_backend

    cuda_backend._cuda_backend = lambda device: True
    for module in (cuda_backend, cuda_attention):
        module.cuda_available = lambda: True

    def kernel(**_: Any) -> Any:
        return lambda output_shapes, output_dtypes, **__: [mx.zeros(s, dtype=d)
                                                             for s, d in zip(output_shapes, output_dtypes)]

    mx.fast.cuda_kernel = kernel


def model_and_cache(bits: int, context: int) -> tuple[Any, list]:
    from bench.prefill import SHAPES, Shape, build_model
    from engine.window import WindowPolicy, make_window_cache

    args = dict(SHAPES["qwen3-32b"].args, hidden_size=256, intermediate_size=512, num_attention_heads=16,
                num_key_value_heads=2, head_dim=128, vocab_size=4096)
    model = build_model(Shape("qwen3", args, 4, "bfloat16", 512, 512, 256), None)
    cache = make_window_cache(model, WindowPolicy(True, 512, 512, 256, 0, "block"), kv_bits=bits)
    for c in cache:
        rows = mx.random.normal((1, 2, context, 128)).astype(mx.bfloat16)
        c.store.write(0, rows, rows)
        c.offset = context
    mx.eval([c.state for c in cache])
    return model, cache


def build_ms(model: Any, cache: list, variant: str, bits: int, steps: int) -> list[float]:
    """Milliseconds to build each of `steps` decode steps (after three untimed ones)."""
    from engine.compute import ComputePath
    from engine.decode_choice import DecodeKernels

    ours = variant != "mlx"
    kernels = DecodeKernels(qmv=ours, attention_mma=ours, kv_write=ours and bits == 8,
                            mlp_compiled=variant == "ours+compiled-mlp", source="setting")
    path = ComputePath(model, kernels=kernels)
    start, token, times = cache[0].offset, mx.array([[7]], dtype=mx.uint32), []
    for i in range(steps + 3):
        for c in cache:
            c.offset = start
        began = time.perf_counter()
        mx.argmax(path.forward(token, cache, logits="last")[:, -1, :], axis=-1)
        if i >= 3:
            times.append((time.perf_counter() - began) * 1e3)
    return times


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", default="16,8")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "decode_build.json"))
    a = ap.parse_args(argv)
    mx.set_default_device(mx.cpu)
    emulate_cuda()
    result: dict[str, Any] = {"machine": machine(), "mlx": mx.__version__, "steps": a.steps, "rows": []}
    for bits in (int(b) for b in a.bits.split(",")):
        model, cache = model_and_cache(bits, a.context)
        for variant in VARIANTS:
            times = build_ms(model, cache, variant, bits, a.steps)
            result["rows"].append({"bits": bits, "variant": variant, "median_ms": round(statistics.median(times), 3),
                                   "min_ms": round(min(times), 3)})
    base = {r["bits"]: r["median_ms"] for r in result["rows"] if r["variant"] == "mlx"}
    print(markdown_table(["KV bits", "variant", "build ms (median)", "min", "vs mlx"],
                         [[r["bits"], r["variant"], r["median_ms"], r["min_ms"], f"{r['median_ms'] / base[r['bits']]:.2f}x"]
                          for r in result["rows"]]))
    save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
