"""Our CUDA decode kernels against MLX's own, on the GPU: correctness, time, and the decode step they make.

Sections (each prints a table row; JSON has every number):

- ``qmv``: `engine.cuda_qmv` against `mx.quantized_matmul` for one Qwen3-32B block's seven
  linears (4-bit, group 64, bf16) at 1 and 4 input rows: max relative error against a float32
  product of the dequantized weights (MLX's own error beside it), time per block, and the
  bytes read per second (packed weights + scales + biases, the bound being the copy bandwidth
  measured in the same run);
- ``attention``: `bench/gpu_attention.py`'s ``decode`` section (our 8-bit decode attentions and
  MLX's bf16 one, 64 calls per evaluation; until the fourth session this section timed one call
  per evaluation, each with an evaluation's fixed cost);
- ``step``: one decode step of the random 64-layer model through `engine.compute` with a
  window cache filled to ``--context`` positions with random keys and values (bf16 and 8-bit),
  MLX's kernels against ours (8-bit attention on the CUDA cores, then on tensor cores), with and
  without evaluation pipelined one step ahead;
- ``dequant``: `engine.cuda_dequant` against `mx.dequantize` on one block's linears (4 and 8
  bits): values that differ, time, bytes per second;
- ``tail``: the forwards of an edit + ask on the 64-layer model over a bf16 cache of
  ``--context`` positions (45, 1,037 and 1,082 rows; quantized kernel, MLX's dequantize, ours;
  the same forwards over an empty cache) and their attention alone;
- ``rows``: an 8-bit cache's rows dequantized for a chunk and copied out for a checkpoint (`bench/gpu_rows.py`).

    bash .gpu/install.sh && python3 bench/gpu_kernels.py --out $OUT/gpu_kernels.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()  # as the engine's start-up step does, before MLX starts

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from bench import gpu_bounds  # noqa: E402
from bench._common import run_sections  # noqa: E402
from bench.gpu_attention import median_ms, rel_err, section_decode  # noqa: E402
from bench.gpu_rows import section_rows  # noqa: E402
from bench.gpu_step import decode_steps, step_model  # noqa: E402
from engine.step_measure import filled_cache  # noqa: E402
from engine import cuda_qmv  # noqa: E402


def block_linears(hidden: int = 5120, inter: int = 25600, heads: int = 64, kv_heads: int = 8, dim: int = 128,
                  bits: int = 4) -> list[nn.QuantizedLinear]:
    shapes = [(hidden, heads * dim), (hidden, kv_heads * dim), (hidden, kv_heads * dim), (heads * dim, hidden),
              (hidden, inter), (hidden, inter), (inter, hidden)]
    linears = []
    for i, (k, n) in enumerate(shapes):
        lin = nn.Linear(k, n, bias=False)
        lin.weight = (mx.random.normal((n, k), key=mx.random.key(i)) * k ** -0.5).astype(mx.bfloat16)
        q = nn.QuantizedLinear.from_linear(lin, group_size=64, bits=bits)
        mx.eval(q.parameters())
        linears.append(q)
    return linears


def linear_bytes(lin: nn.QuantizedLinear) -> int:
    return sum(lin[name].nbytes for name in ("weight", "scales", "biases"))


def section_qmv(result: dict, copy_gbs: float) -> None:
    for bits in (4, 8):
        linears = block_linears(bits=bits)
        nbytes = sum(linear_bytes(m) for m in linears)
        for rows in (1, 4):
            xs = [mx.random.normal((rows, m.weight.shape[1] * 32 // bits), key=mx.random.key(100 + i))
                  .astype(mx.bfloat16) for i, m in enumerate(linears)]
            mx.eval(xs)
            errs_ours, errs_mlx = [], []
            for m, x in zip(linears, xs):
                w = mx.dequantize(m.weight, m.scales, m.biases, m.group_size, m.bits, dtype=mx.float32)
                ref = x.astype(mx.float32) @ w.T
                errs_ours.append(rel_err(cuda_qmv.linear_product(m, x), ref))
                errs_mlx.append(rel_err(nn.QuantizedLinear.__call__(m, x), ref))
            t_mlx = median_ms(lambda: [nn.QuantizedLinear.__call__(m, x) for m, x in zip(linears, xs)], 10, warmup=2)
            t_ours = median_ms(lambda: [cuda_qmv.linear_product(m, x) for m, x in zip(linears, xs)], 10, warmup=2)
            row = {"bits": bits, "rows": rows, "block_bytes": nbytes, "mlx_ms": t_mlx, "ours_ms": t_ours,
                   "mlx_gbs": nbytes / t_mlx / 1e6, "ours_gbs": nbytes / t_ours / 1e6, "copy_gbs": copy_gbs,
                   "err_ours": max(errs_ours), "err_mlx": max(errs_mlx)}
            result.setdefault("qmv", []).append(row)
            print(f"qmv {bits}-bit rows {rows}: MLX {t_mlx:.3f} ms ({row['mlx_gbs']:.0f} GB/s), ours {t_ours:.3f} ms "
                  f"({row['ours_gbs']:.0f} GB/s) of {copy_gbs:.0f}; rel err ours {row['err_ours']:.2e} "
                  f"MLX {row['err_mlx']:.2e}", flush=True)


def section_step(result: dict, context: int, steps: int) -> None:
    model, policy, path = step_model()
    for bits in (16, 8):
        cache = filled_cache(model, policy, bits, context)
        variants = ("mlx", "mlx-pipelined", "ours-qmv-pipelined", "ours-all-pipelined", "ours-all-mma-pipelined")
        for variant in variants[:-1] if bits == 16 else variants:  # the 8-bit attention kernels: 8-bit only
            kernels = {"ours-qmv-pipelined": (True, False, "cores"), "ours-all-pipelined": (True, True, "cores"),
                       "ours-all-mma-pipelined": (True, True, "mma")}.get(variant, (False, False, "cores"))
            mode = "pipelined" if variant.endswith("pipelined") else "sync"
            seconds = decode_steps(path, cache, steps, kernels, mode).seconds
            row = {"kv_bits": bits, "context": context, "variant": variant, "step_ms": seconds * 1e3,
                   "tok_s": 1 / seconds}
            result.setdefault("step", []).append(row)
            print(f"decode step, {bits}-bit KV at {context}: {variant} {seconds * 1e3:.2f} ms "
                  f"({1 / seconds:.1f} tok/s)",
                  flush=True)
        del cache
        mx.clear_cache()


def section_dequant(result: dict, copy_gbs: float) -> None:
    """`engine.cuda_dequant` against `mx.dequantize`: values that differ, time per block."""
    from engine import cuda_dequant

    for bits in (4, 8):
        linears = block_linears(bits=bits)
        args = [(m.weight, m.scales, m.biases, m.group_size) for m in linears]
        mlx = [mx.dequantize(w, s, b, g, bits, dtype=mx.bfloat16) for w, s, b, g in args]
        mx.eval(mlx)
        ours = [cuda_dequant.dequantize(w, s, b, bits=bits, group_size=g, dtype=mx.bfloat16) for w, s, b, g in args]
        mx.eval(ours)
        row = {"bits": bits, "mismatches": sum(int((a != o).sum().item()) for a, o in zip(mlx, ours)),
               "max_diff": max(float(mx.abs(a.astype(mx.float32) - o.astype(mx.float32)).max())
                               for a, o in zip(mlx, ours))}
        row["values"] = sum(a.size for a in mlx)
        nbytes = sum(a.nbytes for a in mlx) + sum(linear_bytes(m) for m in linears)
        row["mlx_ms"] = median_ms(lambda: [mx.dequantize(w, s, b, g, bits, dtype=mx.bfloat16) for w, s, b, g in args],
                                  10, warmup=2)
        row["ours_ms"] = median_ms(lambda: [cuda_dequant.dequantize(w, s, b, bits=bits, group_size=g, dtype=mx.bfloat16)
                                            for w, s, b, g in args], 10, warmup=2)
        row["mlx_gbs"], row["ours_gbs"] = nbytes / row["mlx_ms"] / 1e6, nbytes / row["ours_ms"] / 1e6
        row["copy_gbs"] = copy_gbs
        result.setdefault("dequant", []).append(row)
        print(f"dequant {bits}-bit block: {row}", flush=True)


def _product_mlx(linear: nn.QuantizedLinear, x: mx.array) -> mx.array:
    """MLX's dequantize then matmul (the engine's own product, `deq-ours`, takes our kernel on CUDA)."""
    w = mx.dequantize(linear["weight"], linear["scales"], linear["biases"], linear.group_size, linear.bits,
                      dtype=x.dtype)
    return mx.matmul(x, w.T)


def section_tail(result: dict, context: int) -> None:
    """The forwards of an edit + ask at `context` keys (bf16 KV, dense): where their time goes."""
    from engine import linear_mode
    from engine.window import set_dense_from

    model, policy, path = step_model()
    cache = filled_cache(model, policy, 16, context)
    set_dense_from(cache, context)
    original = linear_mode.dequantized_product

    def forward(rows: int, offset: int, variant: str) -> float:
        ids = mx.array([[7] * rows], dtype=mx.uint32)

        def once():
            for c in cache:
                c.offset = offset
            linear_mode.dequantized_product = original if variant == "deq-ours" else _product_mlx
            try:
                if variant == "qmm":
                    return path.forward(ids, cache, logits="last")
                with linear_mode.dequantized_linears():
                    return path.forward(ids, cache, logits="last")
            finally:
                linear_mode.dequantized_product = original
        return median_ms(once, 3, warmup=2)

    for rows in (45, 1037, 1082):
        for offset in (context, 0):
            for variant in ("qmm", "deq-mlx", "deq-ours"):
                ms = forward(rows, offset, variant)
                result.setdefault("tail", []).append({"rows": rows, "offset": offset, "variant": variant, "ms": ms})
                print(f"tail forward {rows} rows at {offset}: {variant} {ms:.1f} ms", flush=True)
        q = mx.random.normal((1, 64, rows, 128), key=mx.random.key(5)).astype(mx.bfloat16)
        k = cache[0].store.keys[..., :context + rows, :]
        ms = median_ms(lambda: [mx.fast.scaled_dot_product_attention(q, k, k, scale=0.088, mask="causal")
                                for _ in range(64)], 3, warmup=2)
        result.setdefault("tail_attention", []).append({"rows": rows, "keys": context + rows, "ms_64": ms})
        print(f"tail attention {rows} rows over {context + rows} keys x 64 layers: {ms:.1f} ms", flush=True)
    for c in cache:
        c.offset = context


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="8192,32768,131072")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--sections", default="qmv,attention,step")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_kernels.json"))
    a = ap.parse_args(argv)
    result: dict[str, Any] = {"device": str(mx.default_device()), "mlx": mx.__version__, "mlx_env": mlx_env.current()}
    try:
        result["device_info"] = {k: str(v) for k, v in mx.device_info().items()}
    except Exception:  # noqa: BLE001
        pass
    copy_gbs = gpu_bounds.copy_bandwidth()
    result["copy_gbs"] = copy_gbs
    print(f"copy bandwidth {copy_gbs:.0f} GB/s", flush=True)
    sections = a.sections.split(",")
    runners = {"qmv": lambda: section_qmv(result, copy_gbs),
               "attention": lambda: section_decode(result, [int(x) for x in a.lengths.split(",")], copy_gbs),
               "step": lambda: section_step(result, a.context, a.steps),
               "dequant": lambda: section_dequant(result, copy_gbs),
               "tail": lambda: section_tail(result, a.context),
               "rows": lambda: section_rows(result, a.context, copy_gbs)}
    run_sections(runners, sections, result, a.out)
    return result


if __name__ == "__main__":
    main()
