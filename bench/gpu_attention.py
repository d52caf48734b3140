"""Attention on the GPU as a decode step and a prefill chunk see it: our 8-bit kernels, MLX's, and
what a new shape costs MLX's cuDNN path.

Sections (each prints rows; JSON has every number):

- ``decode``: one query (64 heads) over 8 KV heads of dim 128 at each ``--lengths``, timed as a
  decode step runs it: 64 calls (16 distinct caches, each used four times, so nothing stays in
  the 50 MB L2) queued and evaluated at once. Our 8-bit kernels (`engine.cuda_attention`: the
  CUDA-core one and the tensor-core ones, `engine.cuda_attention_mma`,
  `engine.cuda_attention_staged` and `engine.cuda_attention_transposed`) against MLX's fused
  attention over a bf16 cache of the same length; relative error against the 8-bit cache
  dequantized through MLX; the bytes each call reads per second (bound: the copy bandwidth).
- ``plans``: a prefill chunk of 45 and 1,037 queries over ``--context`` keys through
  `mx.fast.scaled_dot_product_attention` (bf16, mask "causal"), 64 calls per evaluation: the
  first evaluation of each new key count (MLX builds a cuDNN plan per exact shape) against the
  same shape warm; then the same chunks padded (queries to a multiple of 64, keys to a multiple
  of 4,096, an additive mask) so that several lengths share one shape.
- ``chunk``: 2, 5, 16 and 45 queries over ``--context`` bf16 keys at two key counts: our split-key
  tensor-core kernel (`engine.cuda_chunk_attention`) against MLX's attention, first evaluation
  and warm, relative error of both against a float32 attention; then over the keys in 8 bits, our
  8-bit kernel against the rows dequantized and our bf16 kernel.

    bash .gpu/install.sh && python3 bench/gpu_attention.py --out $OUT/gpu_attention.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()  # as the engine's start-up step does, before MLX starts

import mlx.core as mx  # noqa: E402

from bench import gpu_bounds  # noqa: E402
from bench._common import run_sections  # noqa: E402
from engine import cuda_attention, qkv  # noqa: E402
from engine.timing import median_seconds  # noqa: E402
from engine.timing import seconds as timed  # noqa: E402

HEADS, KV_HEADS, DIM, CALLS, DISTINCT = 64, 8, 128, 64, 16


def median_ms(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    """`engine.timing.median_seconds` in milliseconds."""
    return median_seconds(fn, repeats, warmup) * 1e3


def buffer_positions(n: int) -> int:
    """The positions of a buffer holding `n` as a write grows it (`engine.qkv.capacity`; the engine's live cache
    keeps up to `engine.qkv.ROOM_AHEAD` more, which our kernels skip and MLX's traced attention masks)."""
    return qkv.capacity(n)


def rel_err(a: mx.array, ref: mx.array) -> float:
    a, ref = a.astype(mx.float32), ref.astype(mx.float32)
    return float(mx.linalg.norm((a - ref).flatten()) / mx.linalg.norm(ref.flatten()))


def section_decode(result: dict, lengths: list[int], copy_gbs: float) -> None:
    scale = DIM ** -0.5
    for n in lengths:
        # Buffers as a live cache holds them: MLX's bf16 decode attention takes cuDNN's padded path
        # only for such buffers (else its slower vector kernel).
        cap = buffer_positions(n + 1)
        caches = []
        for i in range(DISTINCT):
            k = mx.random.normal((1, KV_HEADS, cap, DIM), key=mx.random.key(10 + i)).astype(mx.bfloat16)
            v = mx.random.normal((1, KV_HEADS, cap, DIM), key=mx.random.key(100 + i)).astype(mx.bfloat16)
            kq, vq = mx.quantize(k, group_size=64, bits=8), mx.quantize(v, group_size=64, bits=8)
            mx.eval(k, v, kq, vq)
            caches.append((k, v, kq, vq))
        q = mx.random.normal((1, HEADS, 1, DIM), key=mx.random.key(3)).astype(mx.bfloat16) * 3
        k, _, kq, vq = caches[0]
        ref = cuda_attention.reference(q.astype(mx.float32), kq, vq, n, scale, 64)
        row: dict[str, Any] = {"keys": n, "calls": CALLS}
        for kernel in DECODE_KERNELS:
            row[f"err_{kernel}"] = rel_err(cuda_attention.decode_attention(q, kq, vq, n, scale, 64, kernel), ref)
            row[f"{kernel}_ms"] = median_ms(lambda: [
                cuda_attention.decode_attention(q, caches[i % DISTINCT][2], caches[i % DISTINCT][3], n, scale, 64,
                                                kernel) for i in range(CALLS)]) / CALLS
        row["bf16_ms"] = median_ms(lambda: [
            mx.fast.scaled_dot_product_attention(q, caches[i % DISTINCT][0][..., :n, :],
                                                 caches[i % DISTINCT][1][..., :n, :], scale=scale)
            for i in range(CALLS)]) / CALLS
        bytes8 = sum(a[..., :n, :].nbytes for a in (*kq, *vq))
        bytes16 = 2 * k[..., :n, :].nbytes
        row.update({f"{kernel}_gbs": bytes8 / row[f"{kernel}_ms"] / 1e6 for kernel in DECODE_KERNELS})
        row.update(bytes_8bit=bytes8, bytes_bf16=bytes16, bf16_gbs=bytes16 / row["bf16_ms"] / 1e6, copy_gbs=copy_gbs)
        row["staged_variants"] = staged_variants(q, caches, n, scale, ref, bytes8)
        result.setdefault("decode", []).append(row)
        ours = ", ".join(f"8-bit {kernel} {row[f'{kernel}_ms']:.3f} ms ({row[f'{kernel}_gbs']:.0f} GB/s, rel err "
                         f"{row[f'err_{kernel}']:.2e})" for kernel in DECODE_KERNELS)
        print(f"decode attention over {n} keys, per call: {ours}, bf16 MLX {row['bf16_ms']:.3f} ms "
              f"({row['bf16_gbs']:.0f} GB/s) of {copy_gbs:.0f}", flush=True)
        caches.clear()
        mx.clear_cache()


DECODE_KERNELS = ("cores", "mma", "staged", "transposed")
"""`engine.cuda_attention.decode_attention`'s kernels, each timed at its defaults."""
STAGED_VARIANTS = (("staged", 4, 1024, 0, False), ("staged", 3, 1584, 0, False), ("transposed", 4, 1584, 0, False),
                   ("transposed", 4, 1584, 0, True), ("transposed", 3, 1584, 0, True), ("transposed", 6, 1056, 0, True),
                   ("transposed", 3, 2112, 4, False), ("transposed", 3, 3168, 0, True))
"""(kernel, stages, target warps, min blocks: launch bounds, 0 none; the transposed kernel's warps folded in
each block, `cuda_attention_transposed.COMBINE`) of the staged kernels (`engine.cuda_attention_staged`,
`engine.cuda_attention_transposed`) tried beside their defaults: the transposed kernel's defaults before the
seventeenth session (a partial a warp, three blocks a multiprocessor) and with its warps folded at three blocks;
`cuda_attention_transposed.FOUR_BLOCKS` (which spills with `COMBINE`); two waves of shorter splits."""


def staged_variants(q: mx.array, caches: list, n: int, scale: float, ref: mx.array, nbytes: int) -> list[dict]:
    """The staged kernels' partial attention and merge at each of `STAGED_VARIANTS`, as the decode rows time it."""
    from engine import cuda_attention_mma, cuda_attention_staged, cuda_attention_transposed

    modules = {"staged": cuda_attention_staged, "transposed": cuda_attention_transposed}

    def call(kq: tuple, vq: tuple, kernel: str, stages: int, warps: int, blocks: int, combine: bool) -> mx.array:
        options = {"min_blocks": blocks} if blocks else {}
        if kernel == "transposed":
            options["combine"] = combine
        part = modules[kernel].partial_attention(q, kq, vq, n, scale, stages=stages, target_warps=warps, **options)
        return cuda_attention_mma.merge(*part, q.dtype, q.shape)

    rows = []
    for kernel, stages, warps, blocks, combine in STAGED_VARIANTS:
        variant = {"kernel": kernel, "stages": stages, "target_warps": warps, "min_blocks": blocks, "combine": combine}
        try:
            err = rel_err(call(caches[0][2], caches[0][3], kernel, stages, warps, blocks, combine), ref)
            ms = median_ms(lambda: [call(caches[i % DISTINCT][2], caches[i % DISTINCT][3], kernel, stages, warps,
                                         blocks, combine) for i in range(CALLS)]) / CALLS
        except Exception as failure:  # noqa: BLE001 - a variant that does not launch is a row that says so
            rows.append({**variant, "error": repr(failure)})
            continue
        rows.append({**variant, "ms": ms, "gbs": nbytes / ms / 1e6, "err": err})
        print(f"  {kernel}, {stages} stages, about {warps} warps" + (f", {blocks} blocks bound" if blocks else "")
              + (", a partial a block" if combine else "")
              + f": {ms:.3f} ms ({nbytes / ms / 1e6:.0f} GB/s), rel err {err:.2e}", flush=True)
    return rows


def _padding(q: mx.array, offset: int) -> tuple[mx.array, int, mx.array]:
    """`q` (rows at positions offset..) padded to a multiple of 64 rows, the key count rounded up to a
    multiple of 4,096, and the additive mask that keeps each real row to keys [0, its position]."""
    rows = q.shape[2]
    rows_p, keys_p = -(-rows // 64) * 64, -(-(offset + rows) // 4096) * 4096
    qp = mx.concatenate([q, mx.zeros((1, HEADS, rows_p - rows, DIM), q.dtype)], axis=2)
    pos = mx.arange(rows_p)[:, None] + offset
    keys = mx.arange(keys_p)[None]
    allowed = (keys <= pos) & (keys < offset + rows)
    mask = mx.where(allowed, 0.0, -mx.inf).astype(q.dtype)[None, None]
    mx.eval(qp, mask)
    return qp, keys_p, mask


def _padded(padding: tuple, k: mx.array, v: mx.array, rows: int, scale: float) -> mx.array:
    qp, keys_p, mask = padding
    return mx.fast.scaled_dot_product_attention(qp, k[..., :keys_p, :], v[..., :keys_p, :], scale=scale,
                                                mask=mask)[..., :rows, :]


def random_kv(cap: int) -> tuple[mx.array, mx.array]:
    """Random bf16 keys and values of `cap` positions (evaluated)."""
    k = mx.random.normal((1, KV_HEADS, cap, DIM), key=mx.random.key(1)).astype(mx.bfloat16)
    v = mx.random.normal((1, KV_HEADS, cap, DIM), key=mx.random.key(2)).astype(mx.bfloat16)
    mx.eval(k, v)
    return k, v


def section_plans(result: dict, context: int) -> None:
    scale = DIM ** -0.5
    k, v = random_kv(context + 16384)
    for rows in (45, 1037):
        q = mx.random.normal((1, HEADS, rows, DIM), key=mx.random.key(rows)).astype(mx.bfloat16)
        for offset in (context, context + 7, context + 1301):
            def plain():
                return [mx.fast.scaled_dot_product_attention(q, k[..., :offset + rows, :], v[..., :offset + rows, :],
                                                             scale=scale, mask="causal") for _ in range(CALLS)]

            padding = _padding(q, offset)

            def padded():
                return [_padded(padding, k, v, rows, scale) for _ in range(CALLS)]

            row: dict[str, Any] = {"rows": rows, "offset": offset}
            row["plain_first_ms"] = timed(plain) * 1e3
            row["plain_warm_ms"] = median_ms(plain, 3)
            row["padded_first_ms"] = timed(padded) * 1e3
            row["padded_warm_ms"] = median_ms(padded, 3)
            row["padded_err"] = rel_err(_padded(padding, k, v, rows, scale),
                                        mx.fast.scaled_dot_product_attention(
                                            q, k[..., :offset + rows, :], v[..., :offset + rows, :], scale=scale,
                                            mask="causal"))
            result.setdefault("plans", []).append(row)
            print(f"prefill attention, {rows} rows over {offset} keys ({CALLS} calls): causal first "
                  f"{row['plain_first_ms']:.1f} ms, warm {row['plain_warm_ms']:.1f}; padded + mask first "
                  f"{row['padded_first_ms']:.1f}, warm {row['padded_warm_ms']:.1f} (rel err {row['padded_err']:.1e})",
                  flush=True)


def eight_bit_chunk(q: mx.array, kq: tuple, vq: tuple, n: int, scale: float) -> dict[str, float]:
    """The same chunk over the keys and values quantized to 8 bits: the 8-bit kernel reading the rows where they
    lie, against the engine's path without it (the rows dequantized as the store reads them, then our bf16
    kernel), warm; relative error against the dequantized rows' float32 attention."""
    from engine import cuda_chunk_attention as chunk
    from engine import cuda_dequant

    def dequantized() -> list[mx.array]:
        out = []
        for _ in range(CALLS):
            rows = [cuda_dequant.rows_of(*(a[..., :n, :] for a in t), bits=8, group_size=64) for t in (kq, vq)]
            out.append(chunk.chunk_attention(q, *rows, n, scale))
        return out

    def ours() -> list[mx.array]:
        return [chunk.chunk_attention(q, kq, vq, n, scale) for _ in range(CALLS)]

    nbytes = sum(a[..., :n, :].nbytes for a in (*kq, *vq))
    first, warm = timed(ours) * 1e3, median_ms(ours, 3)
    return {"q8_first_ms": first, "q8_warm_ms": warm, "q8_gbs": nbytes * CALLS / warm / 1e6,
            "err_q8": rel_err(ours()[0], chunk.reference(q, kq, vq, n, scale)),
            "dequantized_bf16_warm_ms": median_ms(dequantized, 3)}


def section_chunk(result: dict, context: int, copy_gbs: float, warps: list[int]) -> None:
    """Short chunks (2-45 queries) over `context` bf16 keys: `engine.cuda_chunk_attention` against MLX's
    attention (cuDNN), each at two key counts: the first evaluation (our kernel's first includes its
    compilation; MLX's, a new plan) and warm; ours at each block size in `warps`; then over the same keys in
    8 bits (`eight_bit_chunk`)."""
    from engine import cuda_chunk_attention as chunk

    default_warps = chunk.WARPS
    scale = DIM ** -0.5
    k, v = random_kv(buffer_positions(context + 64))
    kq, vq = (tuple(mx.quantize(a, group_size=64, bits=8)) for a in (k, v))  # as an 8-bit store holds them
    mx.eval(kq, vq)
    for rows in (2, 5, 16, 45):
        q = mx.random.normal((1, HEADS, rows, DIM), key=mx.random.key(rows)).astype(mx.bfloat16)
        for offset in (context, context + 7):
            n = offset + rows

            def ours():
                return [chunk.chunk_attention(q, k, v, n, scale) for _ in range(CALLS)]

            def mlx():
                return [mx.fast.scaled_dot_product_attention(q, k[..., :n, :], v[..., :n, :], scale=scale,
                                                             mask="causal") for _ in range(CALLS)]

            nbytes = 2 * k[..., :n, :].nbytes
            ref = chunk.reference(q, k, v, n, scale)
            row: dict[str, Any] = {"rows": rows, "keys": n, "calls": CALLS, "copy_gbs": copy_gbs, "ours": {}}
            try:
                for w in warps:
                    chunk.WARPS = w
                    first, warm = timed(ours) * 1e3, median_ms(ours, 3)
                    row["ours"][w] = {"first_ms": first, "warm_ms": warm, "gbs": nbytes * CALLS / warm / 1e6,
                                      "err": rel_err(chunk.chunk_attention(q, k, v, n, scale), ref)}
            finally:
                chunk.WARPS = default_warps
            row["mlx_first_ms"] = timed(mlx) * 1e3
            row["mlx_warm_ms"] = median_ms(mlx, 3)
            row["err_mlx"] = rel_err(mlx()[0], ref)
            row["mlx_gbs"] = nbytes * CALLS / row["mlx_warm_ms"] / 1e6
            row.update(eight_bit_chunk(q, kq, vq, n, scale))
            result.setdefault("chunk", []).append(row)
            print(f"chunk attention, {rows} rows over {n} keys ({CALLS} calls): " + "; ".join(
                f"ours ({w} warps) first {o['first_ms']:.1f} ms, warm {o['warm_ms']:.1f} ({o['gbs']:.0f} GB/s), "
                f"rel err {o['err']:.1e}" for w, o in row["ours"].items()) +
                f"; MLX first {row['mlx_first_ms']:.1f}, warm {row['mlx_warm_ms']:.1f} ({row['mlx_gbs']:.0f} GB/s), "
                f"rel err {row['err_mlx']:.1e}; 8-bit: ours warm {row['q8_warm_ms']:.1f} ({row['q8_gbs']:.0f} GB/s), "
                f"rel err {row['err_q8']:.1e}, dequantized + bf16 kernel {row['dequantized_bf16_warm_ms']:.1f}",
                flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--sections", default="decode,plans,chunk")
    ap.add_argument("--chunk-warps", default="12", help="block sizes of the chunk attention to measure (warps)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_attention.json"))
    a = ap.parse_args(argv)
    result: dict[str, Any] = {"device": str(mx.default_device()), "mlx": mx.__version__, "mlx_env": mlx_env.current()}
    copy_gbs = gpu_bounds.copy_bandwidth()
    result["copy_gbs"] = copy_gbs
    runners = {"decode": lambda: section_decode(result, [int(x) for x in a.lengths.split(",")], copy_gbs),
               "plans": lambda: section_plans(result, a.context),
               "chunk": lambda: section_chunk(result, a.context, copy_gbs, [int(w) for w in a.chunk_warps.split(",")])}
    run_sections(runners, a.sections.split(","), result, a.out)
    return result


if __name__ == "__main__":
    main()
