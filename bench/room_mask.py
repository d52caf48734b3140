"""What the room ahead costs a decode step where MLX's own attention runs in the traced step.

The engine keeps `engine.qkv.ROOM_AHEAD` positions of room past a window cache's rows so that writes do not grow
the history. The traced decode step (`engine.compiled`) holds the whole buffers; on our CUDA kernels attention
takes the key count and reads only the rows, but where MLX's attention runs in the trace (Metal, and the CPU where
MLX computes attention: `compute.attention: mlx`, or a model NumPy's attention does not take) it attends over the
whole buffer with a mask, so it also reads the room. This times that step at a context with the room the engine
keeps against the same step over buffers that end just past the rows (`engine.qkv.Room` with no room ahead: the
store's 256-position steps, what the engine keeps on such a path, `engine.compute.ComputePath.room_ahead`), in the
same run: a random-weight llama with the widths of a 0.5B model (hidden 896, 14 heads, 2 KV heads of 64, MLP
4,864), float32 as the CPU build loads models, fewer layers (the ratio of a layer's attention to its linears does
not depend on the count), 8-bit and unquantized ("16-bit": the model's float32 here) KV, through MLX's attention
and forward.
The step is evaluated each call and its row taken back, so the context holds. The untraced step (``compile``
off), whose attention reads the rows only, is timed the same way, as the control, and so can the CPU's own paths
(``--paths``: NumPy attention, the NumPy forward), which keep the room.

Where decode reads memory at its bound (Metal), the share is the room's KV bytes over a step's bytes; this CPU
computes it instead, so the ratio here is this machine's, not Apple's (docs/benchmarks.md says both).

    python bench/room_mask.py --out /tmp/room_mask.json
    python bench/room_mask.py --paths untraced --contexts 8192 --aheads 0,4096,32768,98304 --out /tmp/sweep.json

The second form asks whether the step's time follows the buffers' size at all (a copy of the whole buffers per
step would): the same step over buffers with each room ahead, in passes whose order turns, against the first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import preload_blas  # noqa: E402

preload_blas()  # before MLX is imported

import mlx.core as mx  # noqa: E402
from mlx_lm.models import llama  # noqa: E402

from bench._common import blas_arguments, machine, markdown_table, random_llama, save_json  # noqa: E402
from engine import compute, generate, qkv  # noqa: E402
from engine.compute_options import ComputeOptions  # noqa: E402
from engine.window import WindowPolicy, make_window_cache  # noqa: E402


PATHS = {
    "traced": ComputeOptions(attention="mlx", forward="mlx", compile=True),  # MLX's attention, traced
    "untraced": ComputeOptions(attention="mlx", forward="mlx", compile=False),
    "numpy-attention": ComputeOptions(attention="numpy", forward="mlx"),  # the CPU's default for a qwen model
    "numpy-forward": ComputeOptions(attention="numpy", forward="numpy"),  # the CPU's default for a llama model
}
"""The paths timed, by name (the room each cache gets is set here, by the prefill's `Room`, not by the path)."""


def model_of(layers: int) -> llama.Model:
    return random_llama(layers, hidden=896, mlp=4864, heads=14, kv_heads=2, head_dim=64, vocab=8192)


def step_ms(path: compute.ComputePath, model: llama.Model, kv_bits: int, context: int, ahead: int,
            steps: int) -> tuple[float, int]:
    """Median ms of one evaluated decode step of `path` at `context` over buffers made with `ahead` positions of
    room, and the positions the buffers hold."""
    cache = make_window_cache(model, WindowPolicy(False), kv_bits=kv_bits)
    prompt = [1 + i % 8000 for i in range(context)]
    generate.prefill(path, cache, prompt, chunk_size=1024, room=qkv.Room(ahead))
    token = mx.array([[7]])

    def step() -> float:
        began = time.perf_counter()
        mx.eval(path.forward(token, cache, logits="last"))
        took = time.perf_counter() - began
        for layer in cache:  # the row taken back: every step runs at the same context
            layer.offset -= 1
        return took * 1e3

    step()  # traced (and on the CPU its fused kernels compiled) for this buffer size
    held = cache[0].written()[0].shape[2]
    return statistics.median(step() for _ in range(steps)), held


def sweep(path_name: str, model: llama.Model, context: int, aheads: list[int], passes: int, steps: int) -> list[dict]:
    """`path_name`'s step at `context` over buffers with each room ahead in `aheads`, in `passes` passes whose order
    turns by one each pass (a drift of the machine then falls on every size), both KV widths."""
    path = compute.choose(model, PATHS[path_name])
    rows = []
    for bits in (8, 16):
        times: dict[int, list[float]] = {a: [] for a in aheads}
        held: dict[int, int] = {}
        for n in range(passes):
            for ahead in aheads[n % len(aheads):] + aheads[:n % len(aheads)]:
                ms, held[ahead] = step_ms(path, model, bits, context, ahead, steps)
                times[ahead].append(ms)
        base = statistics.median(times[aheads[0]])
        rows += [{"step": path_name, "context": context, "kv_bits": bits, "ahead": a, "held": held[a],
                  "ms_passes": times[a], "ms": statistics.median(times[a]),
                  "ratio": statistics.median(times[a]) / base, "path": path.identity()} for a in aheads]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--paths", default="traced,untraced", help=f"of {', '.join(PATHS)}")
    parser.add_argument("--out", default="")
    parser.add_argument("--aheads", default="", help="instead: sweep these rooms ahead (positions, the first the "
                        "baseline) over the first path and context, e.g. 0,4096,32768,98304")
    parser.add_argument("--passes", type=int, default=3, help="with --aheads: passes, each in a turned order")
    blas_arguments(parser)
    args = parser.parse_args()
    model = model_of(args.layers)
    if args.aheads:
        path_name, context = args.paths.split(",")[0], int(args.contexts.split(",")[0])
        rows = sweep(path_name, model, context, [int(a) for a in args.aheads.split(",")], args.passes, args.steps)
        print(markdown_table(["step", "context", "KV", "room ahead", "buffer", "step ms (each pass)", "median",
                              "/ first"],
                             [[r["step"], r["context"], f"{r['kv_bits']}-bit", r["ahead"], r["held"],
                               " ".join(f"{t:.1f}" for t in r["ms_passes"]), f"{r['ms']:.2f}", f"{r['ratio']:.3f}"]
                              for r in rows]))
        if args.out:
            save_json({"machine": machine(), "layers": args.layers, "sweep": True, "rows": rows}, args.out)
        return
    rows = []
    for name in args.paths.split(","):
        path = compute.choose(model, PATHS[name])
        if name == "traced" and path.decode_step is None:
            sys.exit("no traced decode step on this path: " + path.identity())
        for context in (int(c) for c in args.contexts.split(",")):
            for bits in (8, 16):
                tight, tight_held = step_ms(path, model, bits, context, 0, args.steps)
                roomy, roomy_held = step_ms(path, model, bits, context, qkv.ROOM_AHEAD, args.steps)
                rows.append({"step": name, "context": context, "kv_bits": bits,
                             "held_tight": tight_held, "held_room": roomy_held, "ms_tight": tight,
                             "ms_room": roomy, "ratio": roomy / tight, "path": path.identity()})
    table = [[r["step"], r["context"], f"{r['kv_bits']}-bit", r["held_tight"], r["ms_tight"], r["held_room"],
              r["ms_room"], f"{r['ratio']:.3f}"] for r in rows]
    print(markdown_table(["step", "context", "KV", "buffer (tight)", "step ms", "buffer (room)", "step ms",
                          "room / tight"], table))
    if args.out:
        save_json({"machine": machine(), "layers": args.layers, "room_ahead": qkv.ROOM_AHEAD, "rows": rows},
                  args.out)


if __name__ == "__main__":
    main()
