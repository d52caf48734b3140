"""Where prefill time goes: per-op timings of one layer, summed over a prefill.

`bench/prefill.py` measures whole prefills. This script times the pieces of
one transformer layer on the same random-weight shape, at the chunk size the
prefill uses, and adds them up the way a prefill of N tokens runs them:

- linear: the layer's projections and MLP on one chunk (4-bit `quantized_matmul`
  for the 32B shape), plus the same MLP matmul with bf16 weights for comparison;
- attention: the fused `scaled_dot_product_attention` of one chunk over K keys
  (K grows with the position for dense attention, stays G + W + chunk when windowed);
- dequantize: reading K keys and values back from 8-bit storage (the 8-bit modes).

The sum per mode is set beside the measured prefill (from `bench/prefill.py`'s
JSON when given) to show which part bounds the speed-up.

    python bench/prefill_profile.py --shape qwen3-32b --device gpu --lengths 32768,65536,131072
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from bench.prefill import SHAPES, build_model  # noqa: E402


def timed(fn, reps: int = 5) -> float:
    """Median seconds of `fn()` (evaluated), after one untimed call."""
    mx.eval(fn())
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def layer_timings(model, chunk: int, key_counts: list[int], dtype) -> dict:
    """Seconds per chunk of one layer's linear work, attention over K keys, 8-bit reads."""
    layer, args = model.layers[0], model.args
    heads, kv_heads, hd = args.num_attention_heads, args.num_key_value_heads, args.head_dim
    attn = layer.self_attn
    x = mx.random.normal((1, chunk, args.hidden_size)).astype(dtype)
    o_in = mx.random.normal((1, chunk, heads * hd)).astype(dtype)

    def linear():
        return [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x), attn.o_proj(o_in), layer.mlp(x)]

    up = layer.mlp.up_proj
    w_bf16 = (mx.dequantize(up.weight, up.scales, up.biases, up.group_size, up.bits)
              if hasattr(up, "bits") else up.weight).astype(dtype)
    out = dict(linear=timed(linear), attention={}, dequantize={})
    mm = timed(lambda: x @ w_bf16.T)
    qmm = timed(lambda: up(x))
    flops = 2.0 * chunk * w_bf16.shape[0] * w_bf16.shape[1]
    out["mlp_up_matmul"] = dict(quantized_s=qmm, bf16_s=mm, quantized_tflops=flops / qmm / 1e12,
                                bf16_tflops=flops / mm / 1e12)
    q = mx.random.normal((1, heads, chunk, hd)).astype(dtype)
    for k_count in key_counts:
        k = mx.random.normal((1, kv_heads, k_count, hd)).astype(dtype)
        v = mx.random.normal((1, kv_heads, k_count, hd)).astype(dtype)
        out["attention"][k_count] = timed(
            lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=hd ** -0.5, mask="causal"))
        kq, vq = mx.quantize(k, 64, 8), mx.quantize(v, 64, 8)
        mx.eval(kq, vq)
        out["dequantize"][k_count] = timed(
            lambda: [mx.dequantize(*kq, group_size=64, bits=8).astype(dtype),
                     mx.dequantize(*vq, group_size=64, bits=8).astype(dtype)])
        del k, v, kq, vq
    return out


def keys_seen(start: int, size: int, n: int, windowed: bool, g: int, w: int, tail: int) -> int:
    """Keys the chunk [start, start + size) attends to (block window rule of engine.window)."""
    if windowed and start + size <= n - tail and start - w > g:
        return g + w + size
    return start + size


def interpolate(points: dict[int, float], k: int) -> float:
    """Piecewise-linear in the key count (attention and reads are linear in K)."""
    xs = sorted(points)
    if k <= xs[0]:
        return points[xs[0]] * k / xs[0]
    for a, b in zip(xs, xs[1:]):
        if k <= b:
            return points[a] + (points[b] - points[a]) * (k - a) / (b - a)
    a, b = xs[-2], xs[-1]
    return points[b] + (points[b] - points[a]) * (k - b) / (b - a)


def predict(t: dict, n: int, chunk: int, layers: int, g: int, w: int, tail: int) -> dict:
    """Summed per-op seconds of a whole prefill, per mode."""
    rows = {}
    for mode, windowed, bits in (("dense-16", False, 16), ("window-16", True, 16),
                                 ("dense-8", False, 8), ("window-8", True, 8)):
        lin = att = deq = 0.0
        for start in range(0, n, chunk):
            size = min(chunk, n - start)
            k = keys_seen(start, size, n, windowed, g, w, tail)
            lin += t["linear"] * size / chunk
            att += interpolate(t["attention"], k)
            if bits == 8:
                deq += interpolate(t["dequantize"], k - size)  # the chunk itself is fresh
        rows[mode] = dict(linear_s=round(lin * layers, 2), attention_s=round(att * layers, 2),
                          dequantize_s=round(deq * layers, 2),
                          total_s=round((lin + att + deq) * layers, 2))
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--lengths", default="8192,16384,32768")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--measured", default=None, help="bench/prefill.py JSON to compare with")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    shape = SHAPES[a.shape]
    chunk = a.chunk or (2048 if a.device == "gpu" else 512)
    g, w, tail = shape.global_tokens, shape.window_tokens, shape.dense_tail
    lengths = [int(x) for x in a.lengths.split(",")]
    model = build_model(shape, layers=1)
    layers = shape.args["num_hidden_layers"]
    dtype = getattr(mx, shape.dtype)
    ks = sorted({chunk, g + w + chunk, *lengths, *(n // 2 for n in lengths)})
    t = layer_timings(model, chunk, ks, dtype)
    measured = {}
    if a.measured:
        for r in json.loads(Path(a.measured).read_text())["rows"]:
            measured[(r["mode"], r["tokens"])] = r["seconds"]
    result = dict(shape=a.shape, device=a.device, chunk=chunk, layers=layers, window=[g, w], tail=tail,
                  per_layer_per_chunk=t, predicted={})
    lines = ["| tokens | mode | linear s | attention s | dequantize s | sum s | measured s |",
             "|---|---|---|---|---|---|---|"]
    for n in lengths:
        rows = predict(t, n, chunk, layers, g, w, tail)
        result["predicted"][n] = rows
        for mode, r in rows.items():
            m = measured.get((mode, n))
            lines.append(f"| {n:,} | {mode} | {r['linear_s']} | {r['attention_s']} | {r['dequantize_s']} | "
                         f"{r['total_s']} | {m if m is not None else '-'} |")
    up = t["mlp_up_matmul"]
    lines.append(f"\nMLP up-projection on one chunk: 4-bit {up['quantized_tflops']:.0f} TFLOP/s, "
                 f"bf16 weights {up['bf16_tflops']:.0f} TFLOP/s")
    print("\n".join(lines))
    out = Path(a.out or f"bench/results/prefill-profile-{a.shape}-{a.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main()
