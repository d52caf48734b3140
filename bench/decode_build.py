"""The host's cost of building one decode step, measured on a machine without the GPU.

On the H200 building a decode step's graph in Python and submitting it took as long as the whole
step (docs/benchmarks.md, *GPU engine*, eighth session). Building it does not need
the GPU. This script builds the step of a 64-layer Qwen3-32B-shaped model, 4-bit, with the
widths cut down (the Python work per layer is the same). It uses the compute path the engine
takes on CUDA: our quantized linears, and for an 8-bit cache our tensor-core attention and
in-place write. It times the building only; each step is evaluated afterwards, untimed, so the next
one builds on evaluated arrays as in decode.

MLX's CUDA backend is not here, so its kernel call is replaced by a stand-in. This is a fake of a
thing we do not own and cannot run here: `mx.fast.cuda_kernel` returns zeros of the declared
outputs, made to depend on the kernel's inputs (`mx.depends`), so a trace keeps everything before
them. The CUDA checks are forced on. The stand-in costs MLX two operations where the real kernel
costs one, so only the Python around the kernels, and MLX's building of the other operations, is
measured. Everything is put back when the measurement ends (`emulated_cuda`). Variants, each
against ``mlx`` (MLX's own kernels, the same model) in the same run:

- ``ours``: the engine's path on CUDA without `engine.compiled_mlp`;
- ``ours+compiled-mlp``: with it, each block's MLP replayed from its trace (the engine takes it
  where it measured it faster at load; whether MLX traces our CUDA kernels is not known here);
- ``ours+fused``: ``ours`` with each block's q, k, v projections in one launch, its MLP's gate and up
  projections with the activation in one more, and one token's norms and RoPE in one more
  (`engine.fused_linears`, the engine's ``qmv_fused`` and ``rope_fused``; taken where measured faster at load);
- ``ours+traced-step``: the whole step replayed from one trace (`engine.compiled`, the engine's
  ``step_traced`` for 8-bit caches and ``step_traced_bf16``, with the chunk attention, for bf16 ones;
  likewise taken where measured faster at load): building it is replaying the trace (MLX makes the
  step's arrays from it, in C++) plus the Python around it; ``ours+traced-step+fused``: with the fused
  launches in the trace.

A traced step is traced again for each new size of the cache buffers (here a write grows them by 256 rows;
the engine keeps room ahead, `engine.qkv.ROOM_AHEAD`), in the decode step that first meets it. ``new trace
ms`` is that step's building, over a cache whose buffers have a size this variant has not met (its first trace,
untimed, made the fused kernels: on the CPU a C++ compiler builds them, on CUDA NVRTC, once per process).

    python bench/decode_build.py --out /tmp/decode_build.json
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402

from bench._common import machine, markdown_table, save_json  # noqa: E402

VARIANTS = ("mlx", "ours", "ours+fused", "ours+compiled-mlp", "ours+traced-step", "ours+traced-step+fused")


@contextlib.contextmanager
def emulated_cuda() -> Iterator[None]:
    """Inside: the CUDA checks forced on, MLX's kernel call a stand-in (see the module docstring)."""
    from engine import (cuda_attention, cuda_attention_mma, cuda_backend, cuda_chunk_attention, cuda_dequant,
                        cuda_kv_write, cuda_qk_rope, cuda_qmv)

    def kernel(**_: Any) -> Any:
        def call(inputs: list, output_shapes: list, output_dtypes: list, **__: Any) -> list:
            zeros = [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
            return mx.depends(zeros, list(inputs))
        return call

    patched = [(cuda_backend, "cuda_available", lambda: True),
               (cuda_attention, "cuda_available", lambda: True), (mx.fast, "cuda_kernel", kernel)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    factories = [cuda_attention._kernels, cuda_attention_mma._kernel, cuda_attention_mma._merge_kernel,
                 cuda_chunk_attention._kernel, cuda_dequant._kernel, cuda_kv_write._q8_kernel, cuda_qmv._kernel,
                 cuda_qmv._three_kernel, cuda_qmv._glu_kernel, cuda_qk_rope._kernel]
    for owner, name, value in patched:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        for factory in factories:  # the stand-ins they kept
            factory.cache_clear()


def model_and_cache(bits: int, context: int) -> tuple[Any, list]:
    from bench.prefill import SHAPES, Shape, build_model

    args = dict(SHAPES["qwen3-32b"].args, hidden_size=256, intermediate_size=512, num_attention_heads=16,
                num_key_value_heads=2, head_dim=128, vocab_size=4096)
    model = build_model(Shape("qwen3", args, 4, "bfloat16", 512, 512, 256), None)
    return model, cache_of(model, bits, context)


def cache_of(model: Any, bits: int, context: int) -> list:
    """The engine's window caches for `model` holding `context` random rows."""
    from engine.step_measure import filled_cache
    from engine.window import WindowPolicy

    return filled_cache(model, WindowPolicy(True, 512, 512, 256, 0, "block"), bits, context)


def build_ms(model: Any, cache: list, variant: str, bits: int, steps: int,
             grown: list | None = None) -> tuple[list[float], float | None]:
    """Milliseconds to build each of `steps` decode steps (after three untimed ones), and for a traced variant
    the first step over `grown` (a cache whose buffers are larger: a new trace)."""
    from engine.compute import ComputePath
    from engine.decode_choice import DecodeKernels

    ours = variant != "mlx"
    traced = variant.startswith("ours+traced-step")
    kernels = DecodeKernels(qmv=ours, attention_mma=ours, kv_write=ours and bits == 8,
                            mlp_compiled=variant == "ours+compiled-mlp", step_traced=traced and bits == 8,
                            qmv_fused=variant.endswith("+fused"), rope_fused=variant.endswith("+fused"),
                            attention_chunk=traced and bits == 16, step_traced_bf16=traced and bits == 16,
                            source="setting")
    path = ComputePath(model, kernels=kernels, compiled=traced)  # (compiled: MLX's step traced too)
    start, token, built = cache[0].offset, mx.array([[7]], dtype=mx.uint32), []
    for i in range(steps + 3):
        for c in cache:
            c.offset = start
        began = time.perf_counter()
        step = mx.argmax(path.forward(token, cache, logits="last")[:, -1, :], axis=-1)
        if i >= 3:
            built.append((time.perf_counter() - began) * 1e3)
        # untimed: the next step builds on evaluated arrays (the buffers, not `state`: its views would keep
        # the next write from going in place, as a checkpoint does)
        mx.eval(step, [c.store.buffers() for c in cache])
    if traced and (path.decode_step.traces, path.decode_step.fallbacks) != (1, 0):
        raise RuntimeError(f"the traced step was not replayed: {path.decode_step.__dict__}")
    if not traced or grown is None:
        return built, None
    began = time.perf_counter()
    step = mx.argmax(path.forward(token, grown, logits="last")[:, -1, :], axis=-1)
    new_trace = (time.perf_counter() - began) * 1e3
    mx.eval(step)
    if path.decode_step.traces != 2:
        raise RuntimeError(f"the grown cache was not traced anew: {path.decode_step.__dict__}")
    return built, new_trace


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", default="16,8")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "decode_build.json"))
    a = ap.parse_args(argv)
    result: dict[str, Any] = {"machine": machine(), "mlx": mx.__version__, "steps": a.steps, "rows": []}
    with mx.stream(mx.cpu), emulated_cuda():
        for bits in (int(b) for b in a.bits.split(",")):
            model, cache = model_and_cache(bits, a.context)
            for variant in VARIANTS:
                grown = cache_of(model, bits, a.context + 256) if variant.startswith("ours+traced-step") else None
                built, new_trace = build_ms(model, cache, variant, bits, a.steps, grown)
                result["rows"].append({"bits": bits, "variant": variant,
                                       "median_ms": round(statistics.median(built), 3), "min_ms": round(min(built), 3),
                                       "new_trace_ms": None if new_trace is None else round(new_trace, 1)})
    base = {r["bits"]: r["median_ms"] for r in result["rows"] if r["variant"] == "mlx"}
    print(markdown_table(["KV bits", "variant", "build ms (median)", "min", "vs mlx", "new trace ms"],
                         [[r["bits"], r["variant"], r["median_ms"], r["min_ms"],
                           f"{r['median_ms'] / base[r['bits']]:.2f}x", r["new_trace_ms"] or ""]
                          for r in result["rows"]]))
    save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
