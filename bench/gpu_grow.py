"""A cache's buffers grown over the whole history on the GPU: a restored store's first write.

A write past a cache's buffers grows every layer's buffers over the whole history: an edit's hot copy after the
cached prefix, the first write after a restore from copies (a checkpoint's arrays end where it ends).
`engine.qkv._grow` now concatenates the kept rows with a zero tail; before, it filled a whole buffer with zeros and
copied the rows over it. Here one layer of a Qwen3-32B-shaped 8-bit store (8 KV heads, dim 128) holding `--rows`
rows is restored from its own state and written `--write` rows, both ways in turn: milliseconds a layer (best of
`--repeats`) and the 64-layer figure. The peer is the previous way, kept here.

    # on the lent GPU (device tool, carry [".gpu"]):
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_grow.py --out $OUT/gpu_grow.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()

import mlx.core as mx  # noqa: E402

from engine import qkv  # noqa: E402

LAYERS = 64


def fill_then_copy(buf: mx.array | None, keep: int, capacity: int, like: mx.array) -> mx.array:
    """The previous `_grow`: a buffer of zeros, the kept rows written over it."""
    fresh = mx.zeros((*like.shape[:2], capacity, like.shape[3]), like.dtype)
    if buf is None or keep == 0:
        return fresh
    fresh[..., :keep, :] = buf[..., :keep, :]
    return fresh


def first_write_ms(grow, views: tuple[mx.array, ...], rows: int, new: mx.array, repeats: int) -> float:
    kept = qkv._grow
    qkv._grow = grow
    try:
        best = float("inf")
        for _ in range(repeats):
            store = qkv.QuantizedKVStore()
            store.load(views)
            mx.synchronize()
            start = time.perf_counter()
            store.write(rows, new, new)
            mx.eval(*store.keys, *store.values)
            mx.synchronize()
            best = min(best, time.perf_counter() - start)
        return best * 1e3
    finally:
        qkv._grow = kept


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=131072)
    ap.add_argument("--write", type=int, default=45)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_grow.json"))
    a = ap.parse_args(argv)
    store = qkv.QuantizedKVStore()
    full = mx.random.normal((1, 8, a.rows, 128), key=mx.random.key(1)).astype(mx.bfloat16)
    store.write(0, full, full)
    views = store.state(a.rows)
    mx.eval(*views)
    new = mx.random.normal((1, 8, a.write, 128), key=mx.random.key(2)).astype(mx.bfloat16)
    mx.eval(new)
    held = sum(v.nbytes for v in views)
    result = {"mlx": mx.__version__, "device": str(mx.default_device()), "rows": a.rows, "write": a.write,
              "layer_bytes": held, "runs": []}
    for way, grow in (("fill then copy", fill_then_copy), ("concatenate", qkv._grow)) * 2:
        ms = first_write_ms(grow, views, a.rows, new, a.repeats)
        result["runs"].append({"way": way, "ms_a_layer": ms, "ms_64_layers": ms * LAYERS})
        print(f"{way}: {ms:.3f} ms a layer, {ms * LAYERS:.1f} ms for {LAYERS} layers "
              f"({held / 1e6:.0f} MB of 8-bit history a layer)", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
