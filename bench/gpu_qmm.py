"""Quantized linears of a few dozen rows on the GPU: our tensor-core experiment (`bench/qmm_kernel.py`) against MLX's
`quantized_matmul` and against the dequantized linear mode (`engine.cuda_dequant` then the dense matmul).

A question's forward (about 45 rows) and a verify forward (up to 16) multiply every linear of the model at these
row counts. Per row count: one Qwen3-32B block's seven linears (4-bit, groups of 64, bf16; random weights), the
block taken from `BLOCKS` distinct copies in turn (past the 50 MB L2, as a forward's layers read theirs), each
way's milliseconds a block, the weight bytes read per second, the relative error against a float32 product of
the dequantized weights, and the 64-layer forward's linears at that pace. The peer is MLX's call.

    # on the lent GPU (device tool, carry [".gpu"]):
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_qmm.py --out $OUT/gpu_qmm.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()  # as the engine's start-up step does, before MLX starts

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from bench._common import markdown_table  # noqa: E402
from bench.gpu_attention import median_ms, rel_err  # noqa: E402
from bench.gpu_qmv_mma import quantized  # noqa: E402  (a random 4-bit linear, groups of 64, bf16)
from bench import qmm_kernel  # noqa: E402
from engine.linear_mode import dequantized_product  # noqa: E402

BLOCK = {"q": (8192, 5120), "k": (1024, 5120), "v": (1024, 5120), "o": (5120, 8192), "gate": (25600, 5120),
         "up": (25600, 5120), "down": (5120, 25600)}
"""Qwen3-32B's linears, (N rows, K)."""
LAYERS = 64
BLOCKS = 4
ROWS = (9, 16, 32, 45, 64)


WAYS = {"mlx": lambda m, x: nn.QuantizedLinear.__call__(m, x), "ours": qmm_kernel.linear_product,
        "dequantized": dequantized_product}


def inputs(rows: int) -> dict[int, mx.array]:
    """A random bf16 input of `rows` rows for each input width of the block's linears."""
    return {k: mx.random.normal((1, rows, k), key=mx.random.key(k + rows)).astype(mx.bfloat16)
            for k in {k for _, k in BLOCK.values()}}


def block_ms(call: Any, blocks: list[list[nn.QuantizedLinear]], xs: dict[int, mx.array], repeats: int) -> float:
    """`call(linear, input)` over every block's linears in turn, median ms a block."""
    return median_ms(lambda: [call(m, xs[m.weight.shape[1] * 8]) for block in blocks for m in block],
                     repeats) / len(blocks)


def row_count(blocks: list[list[nn.QuantizedLinear]], rows: int) -> dict[str, Any]:
    """Each way at `rows` rows: ms a block, GB/s of packed weights, relative error on the first block."""
    xs = inputs(rows)
    nbytes = sum(a.nbytes for m in blocks[0] for a in (m.weight, m.scales, m.biases))
    refs = [xs[m.weight.shape[1] * 8].astype(mx.float32)
            @ mx.dequantize(m.weight, m.scales, m.biases, 64, 4, dtype=mx.float32).T for m in blocks[0]]
    out: dict[str, Any] = {"rows": rows, "block_bytes": nbytes}
    for way, call in WAYS.items():
        try:
            out[f"err_{way}"] = max(rel_err(call(m, xs[m.weight.shape[1] * 8]), ref) for m, ref in zip(blocks[0], refs))
            out[f"{way}_ms"] = block_ms(call, blocks, xs, 7)
        except Exception as failure:  # noqa: BLE001 - a way that fails is a row that says so
            out[f"{way}_error"] = repr(failure)
            continue
        out[f"{way}_gbs"] = nbytes / (out[f"{way}_ms"] / 1e3) / 1e9
    return out


def per_shape(blocks: list[list[nn.QuantizedLinear]], rows: int, variants: list[tuple[int, ...]]) -> list[dict]:
    """Each linear of the block alone at `rows` rows: MLX's call and ours under each (`KW`, `TARGET_WARPS`,
    `PREFETCH`[, `ROW_SETS`]) variant, microseconds a call (8 calls an evaluation, each from another block)."""
    out = []
    for index, (name, (n, k)) in enumerate(BLOCK.items()):
        linears = [block[index] for block in blocks]
        x = mx.random.normal((1, rows, k), key=mx.random.key(5)).astype(mx.bfloat16)
        row: dict[str, Any] = {"linear": name, "n": n, "k": k,
                               "mb": sum(a.nbytes for a in (linears[0].weight, linears[0].scales,
                                                            linears[0].biases)) / 1e6}
        calls = 8
        row["mlx_us"] = median_ms(lambda: [WAYS["mlx"](linears[i % BLOCKS], x) for i in range(calls)], 7) / calls * 1e3
        for variant in variants:
            kept = set_variant(variant)
            try:
                label = "ours_" + "_".join(map(str, variant))
                row[label + "_us"] = median_ms(lambda: [qmm_kernel.linear_product(linears[i % BLOCKS], x)
                                                        for i in range(calls)], 7) / calls * 1e3
                row[label + "_splits"] = qmm_kernel.splits(n, k, 4, qmm_kernel.tiles(rows))
            finally:
                set_variant(kept)
        out.append(row)
        print(json.dumps({key: round(v, 1) if isinstance(v, float) else v for key, v in row.items()}), flush=True)
    return out


VARIANT_KNOBS = ("KW", "TARGET_WARPS", "PREFETCH", "ROW_SETS")


def set_variant(variant: tuple[int, ...]) -> tuple[Any, ...]:
    """`qmm_kernel`'s knobs (`VARIANT_KNOBS`; a ROW_SETS of 0 is its own rule) set to `variant`; the old values."""
    kept = tuple(getattr(qmm_kernel, name) for name in VARIANT_KNOBS)
    for name, value in zip(VARIANT_KNOBS, variant):
        setattr(qmm_kernel, name, (value or None) if name == "ROW_SETS" else value)
    return kept


def variant_blocks(blocks: list[list[nn.QuantizedLinear]], rows: int, variants: list[tuple[int, ...]]) -> dict:
    """Ours under each variant against MLX's, ms a block (the block's linears from `BLOCKS` copies in turn)."""
    xs = inputs(rows)
    out = {"rows": rows, "mlx_ms": block_ms(WAYS["mlx"], blocks, xs, 9)}
    for variant in variants:
        kept = set_variant(variant)
        label = "ours_" + "_".join(map(str, variant))
        try:
            out[label] = block_ms(qmm_kernel.linear_product, blocks, xs, 9)
        except Exception as failure:  # noqa: BLE001 - a variant that fails is a cell that says so
            out[label] = repr(failure)
        finally:
            set_variant(kept)
        print(f"{rows} rows, {label}: {out[label]} ms a block (MLX {out['mlx_ms']:.3f})", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--shapes-at", type=int, default=45, help="the row count of the per-linear table (0: none)")
    ap.add_argument("--variants", default="4:2112:2,4:2112:1,8:2112:2,4:1056:2,4:4224:2",
                    help="KW:TARGET_WARPS:PREFETCH triples the per-linear table times")
    ap.add_argument("--block-variants", default="",
                    help="KW:TARGET_WARPS:PREFETCH:ROW_SETS quadruples timed a whole block at each --rows")
    ap.add_argument("--profile", action="store_true",
                    help="only a gate projection at --shapes-at rows, ours then MLX's, three calls each (for ncu)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_qmm.json"))
    a = ap.parse_args(argv)
    if a.profile:
        gate = quantized(*BLOCK["gate"], 3)
        x = mx.random.normal((1, a.shapes_at, BLOCK["gate"][1]), key=mx.random.key(5)).astype(mx.bfloat16)
        for way in ("ours", "mlx"):
            for _ in range(3):
                mx.eval(WAYS[way](gate, x))
        return {}
    blocks = [[quantized(n, k, 10 * b + i) for i, (n, k) in enumerate(BLOCK.values())] for b in range(BLOCKS)]
    result: dict[str, Any] = {"mlx": mx.__version__, "device": str(mx.default_device()), "layers": LAYERS,
                              "counts": []}
    for rows in map(int, a.rows.split(",")):
        result["counts"].append(row_count(blocks, rows))
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1))  # after each row: a cut run keeps what it measured
    table = []
    for r in result["counts"]:
        cells = [r["rows"]]
        for way in WAYS:
            ms = r.get(f"{way}_ms")
            cells.append(f"{ms:.3f} ({ms * LAYERS:.1f}; {r[f'{way}_gbs']:.0f} GB/s; {r[f'err_{way}']:.1e})"
                         if ms is not None else r.get(f"{way}_error", "")[:60])
        cells.append(f"{r['mlx_ms'] / r['ours_ms']:.2f}x" if "mlx_ms" in r and "ours_ms" in r else "")
        table.append(cells)
    print(markdown_table(["rows", *(f"{w}: ms a block ({LAYERS} layers; GB/s; rel err)" for w in WAYS),
                          "mlx / ours"], table))
    if a.block_variants:
        variants = [tuple(map(int, v.split(":"))) for v in a.block_variants.split(",")]
        result["variants"] = [variant_blocks(blocks, rows, variants) for rows in map(int, a.rows.split(","))]
        Path(a.out).write_text(json.dumps(result, indent=1))
    if a.shapes_at:
        variants = [tuple(map(int, v.split(":"))) for v in a.variants.split(",")]
        result["per_linear"] = per_shape(blocks, a.shapes_at, variants)
        Path(a.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
