"""What decode's room check adds to each step's host work, against building the step it sits before.

`engine.generate.decode` asks one window layer, before every step, whether the step's row still fits its
buffers (`engine.generate.keep_room`; where it does not, every layer grows by `ROOM_AHEAD`; a speculative round's
verify asks the same for its rows). On
the GPU the engine's decode is host-bound, so that check is timed here against its peer in the same run: building
one decode step's graph (the forward and the greedy token, not evaluated) of a random-weight llama of the layer
count given, over window caches with room (8-bit and bf16 storage). Both are host work only, so the CPU measures
them.

    python bench/room_check.py --out /tmp/room_check.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402
from mlx_lm.models import llama  # noqa: E402

from bench._common import machine, markdown_table, random_llama, save_json  # noqa: E402
from engine import generate  # noqa: E402
from engine.window import WindowPolicy, make_window_cache  # noqa: E402


def model_of(layers: int) -> llama.Model:
    return random_llama(layers, hidden=256, mlp=512, heads=4, kv_heads=2, head_dim=64, vocab=1024)


def per_call_us(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """Median over `rounds` of the mean microseconds a call over `calls` calls."""
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - began) / calls * 1e6)
    return statistics.median(times)


def measure(model: llama.Model, kv_bits: int, context: int) -> dict[str, float]:
    cache = make_window_cache(model, WindowPolicy(False), kv_bits=kv_bits)
    generate.prefill(model, cache, list(range(1, context + 1)), chunk_size=context)  # room made past the prompt
    token = mx.array([[7]])

    def build() -> None:  # the step's graph, as `decode` builds it; its row taken back so the offset holds
        mx.argmax(model(token, cache=cache)[:, -1, :], axis=-1)
        for layer in cache:
            layer.offset -= 1

    check = per_call_us(lambda: generate.keep_room(cache, 1), calls=20_000)
    step = per_call_us(build, calls=50)
    return {"check_us": check, "build_us": step, "share": check / step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    model = model_of(args.layers)
    rows = {bits: measure(model, bits, args.context) for bits in (8, 16)}
    table = [[f"{bits}-bit", r["check_us"], r["build_us"], f"{r['share']:.3%}"] for bits, r in rows.items()]
    print(markdown_table(["KV", "room check µs", "step build µs", "check / build"], table))
    if args.out:
        save_json({"machine": machine(), "layers": args.layers, "context": args.context,
                   "rows": {str(b): r for b, r in rows.items()}}, args.out)


if __name__ == "__main__":
    main()
