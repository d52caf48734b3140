"""What a traced bf16 decode step's per-layer parts cost as the context grows (MLX's CUDA backend).

The engine's bf16 trace (`engine.trace_caches`, `engine.cuda_chunk_attention`) was chosen at load over 8,192 rows
and ran slower than the untraced step at 131,072 (docs/benchmarks.md, *Fifteenth session*, run h). Per key count,
64 calls each (16 distinct buffers of one layer's keys, grown as a live cache grows), ms per call:

- ``scatter``: one row written into a buffer inside a trace, as the trace writes it (`trace_caches.scattered`,
  `mx.put_along_axis`; the buffer is the traced function's input, also held outside it);
- ``ours``: our chunk kernel attending one query over the buffer with the count as an array (as in the trace);
- ``mlx``: MLX's attention over the first n rows (cuDNN's decode path), as the untraced step attends.

    # device tool, carry [".gpu"]:
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_bf16_trace_parts.py --out $OUT/gpu_bf16_trace_parts.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()

import mlx.core as mx  # noqa: E402

from bench.gpu_attention import buffer_positions, median_ms  # noqa: E402
from engine import cuda_chunk_attention  # noqa: E402
from engine.trace_caches import scattered  # noqa: E402

HEADS, KV_HEADS, DIM, CALLS, DISTINCT = 64, 8, 128, 64, 16


def row(n: int) -> dict:
    cap = buffer_positions(n + 1)
    bufs = [mx.random.normal((1, KV_HEADS, cap, DIM), key=mx.random.key(i)).astype(mx.bfloat16)
            for i in range(DISTINCT)]
    mx.eval(bufs)
    q = mx.random.normal((1, HEADS, 1, DIM), key=mx.random.key(99)).astype(mx.bfloat16)
    new = mx.random.normal((1, KV_HEADS, 1, DIM), key=mx.random.key(98)).astype(mx.bfloat16)
    count = mx.array([n + 1], dtype=mx.int32)
    write = mx.compile(lambda buf, r, at: scattered(buf, r, at))
    at = mx.array([n], dtype=mx.int32)
    scale = DIM ** -0.5
    out = {"keys": n, "buffer_rows": cap}
    out["scatter_ms"] = median_ms(lambda: [write(bufs[i % DISTINCT], new, at) for i in range(CALLS)]) / CALLS
    attend = cuda_chunk_attention.chunk_attention
    out["ours_ms"] = median_ms(lambda: [attend(q, bufs[i % DISTINCT], bufs[i % DISTINCT], count, scale)
                                        for i in range(CALLS)]) / CALLS
    out["mlx_ms"] = median_ms(lambda: [mx.fast.scaled_dot_product_attention(
        q, bufs[i % DISTINCT][..., :n + 1, :], bufs[i % DISTINCT][..., :n + 1, :], scale=scale)
        for i in range(CALLS)]) / CALLS
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}, flush=True)
    bufs.clear()
    mx.clear_cache()
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="8192,32768,131072")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    result = {"mlx": mx.__version__, "device": str(mx.default_device()),
              "rows": [row(int(n)) for n in a.lengths.split(",")]}
    if a.out:
        from bench._common import save_json

        save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
