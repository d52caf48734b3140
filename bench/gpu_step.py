"""Where a GPU decode step's time goes: how it is queued, and what writing the cache costs.

The Qwen3-32B-shaped random model (bench/prefill.py) with the engine's decode kernels on
(`engine.decode_kernels`: our quantized linears; for the 8-bit cache our tensor-core attention),
its windowed cache filled to each ``--lengths`` with bf16 or 8-bit KV. Each step is timed three
ways: ``pipelined`` (the engine's loop: step n + 1 queued before token n is read; ``pipelined_host``:
the host's share of it, building the step and submitting it: a step whose host share is its whole
time is host-bound, or throttled by the device, since MLX's submitting waits while more than ten of its
CUDA graphs are running: `bench/gpu_step_profile.py` tells the two apart),
``wait`` (step n + 1 built while step n runs, queued once token n is read) and ``sync`` (one step
evaluated at a time); the first two again with the cache's one-row writes skipped (the step then
attends over rows that do not change: the timing of everything but the write); on CUDA the 8-bit
configuration again with the cache written by MLX's slice updates, by our in-place kernel
(`engine.cuda_kv_write`), and by it in the whole step replayed from its trace (``ours+traced``,
`engine.compiled`: the engine's ``step_traced``); the bf16 one also replayed from its trace, with
our chunk attention in it (``step_traced_bf16``); both traced again with each block's linears of one input,
and one token's norms and RoPE, in one launch each (``ours+traced+fused``, the engine's ``qmv_fused`` and
``rope_fused``). Both widths again with MLX's kernels only
(``mlx-only``; on CUDA the ``mlx`` rows run our linears and attention beside MLX's write), plain and
replayed from its trace (``mlx-only+traced``; ``mlx+traced`` elsewhere): the engine's step under
``compute.kernels: mlx``, whose traced attention is masked over the whole buffer, which takes MLX's
CUDA attention off its fused kernels. (Since the fourteenth session the engine traces nothing with MLX's
kernels on CUDA, whose dynamic row write costs the whole buffer, `engine.compute`: those rows are left out there.) A process's history matters (``--bits`` orders the widths).
MLX's CUDA graph cache size (`engine.mlx_env`) is read once per process: compare settings with one
process each.

    # on the lent H200 (device tool, carry [".gpu"]):
    bash .gpu/install.sh && python3 bench/gpu_step.py --out $OUT/gpu_step.json
    bash .gpu/install.sh && MLX_CUDA_GRAPH_CACHE_SIZE=100 python3 bench/gpu_step.py --out $OUT/gpu_step-100.json
    python bench/gpu_step.py --shape tiny --lengths 1024 --steps 4 --out /tmp/gpu_step.json   # CPU smoke run
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()  # as the engine's start-up step does, before MLX starts

import mlx.core as mx  # noqa: E402

from bench._common import save_json  # noqa: E402
from engine import decode_kernels, qkv  # noqa: E402
from engine.step_measure import filled_cache  # noqa: E402

MODES = ("pipelined", "wait", "sync")


class StepTimes(NamedTuple):
    """Seconds per decode step of `decode_steps`' last run, and (pipelined only, else 0) the host's share."""

    seconds: float
    host: float  # building the step's graph and submitting it (`mx.async_eval`), not waiting for a token
    python: float  # building it alone


def decode_steps(path: Any, cache: list, steps: int, kernels: tuple[bool, bool, str], mode: str,
                 attempts: int = 2, kv_write: bool = False) -> StepTimes:
    """The times of the last of `attempts` runs of steps + 1 decode steps, the cache reset to its offset
    before each run. kernels: (quantized linears, our attention, which one: "cores", or "mma", "staged" or
    "transposed" where it fits, `engine.cuda_attention.decode_attention`'s names); `kv_write`: our in-place cache
    write."""
    start_offset = cache[0].offset
    token = mx.array([[7]], dtype=mx.uint32)
    times = StepTimes(0.0, 0.0, 0.0)
    with decode_kernels.scope(qmv=kernels[0], attention=kernels[1], mma=kernels[2] == "mma", kv_write=kv_write,
                              staged=kernels[2] == "staged", transposed=kernels[2] == "transposed"):
        for _ in range(attempts):
            for c in cache:
                c.offset = start_offset
            mx.synchronize()
            start = time.perf_counter()
            y = mx.argmax(path.forward(token, cache, logits="last")[:, -1, :], axis=-1)
            mx.async_eval(y)
            building = python = 0.0
            for _ in range(steps):
                built = time.perf_counter()
                nxt = mx.argmax(path.forward(y.reshape(1, 1), cache, logits="last")[:, -1, :], axis=-1)
                if mode == "pipelined":
                    python += time.perf_counter() - built
                    mx.async_eval(nxt)
                    building += time.perf_counter() - built
                    y.item()
                elif mode == "wait":
                    y.item()
                    mx.async_eval(nxt)
                else:
                    mx.eval(nxt)
                y = nxt
            y.item()
            mx.synchronize()
            times = StepTimes((time.perf_counter() - start) / (steps + 1), building / steps, python / steps)
    for c in cache:
        c.offset = start_offset
    return times


@contextlib.contextmanager
def writes_skipped(store_class: type) -> Iterator[None]:
    """One-row writes into `store_class` stores do nothing inside this block."""
    write = store_class.write

    def skip_rows(self, start, keys, values, **options):
        if keys.shape[2] == 1 and self.keys is not None:
            return None
        return write(self, start, keys, values, **options)

    store_class.write = skip_rows
    try:
        yield
    finally:
        store_class.write = write


def step_model(shape_name: str = "qwen3-32b") -> tuple[Any, Any, Any]:
    """A random model of bench/prefill.py's shape wired for our kernels, its window policy, and a
    compute path that leaves the kernels to `decode_kernels.scope` (MLX's otherwise)."""
    from bench.prefill import SHAPES, build_model
    from engine import linear_mode
    from engine.compute import ComputeOptions, choose
    from engine.window import WindowPolicy

    shape = SHAPES[shape_name]
    model = build_model(shape, None)
    linear_mode.wire(model)  # the class whose call can take our kernel
    linear_mode.wire_head(model)  # and the head's, as the engine's path wires it
    policy = WindowPolicy(True, shape.global_tokens, shape.window_tokens, shape.dense_tail, 0, "block")
    return model, policy, choose(model, ComputeOptions(linear="quantized", compile=False, kernels="mlx"))


def step_paths(model: Any, path: Any, attention: str = "mma") -> dict[str, Any]:
    """The step's compute paths by the rows' names: ``ours`` (`path`: the kernels `decode_steps` switches on),
    ``ours+fused`` (the fused launches below, nothing traced: the bf16 step as the engine runs it while the
    bf16 trace is held back), ``ours+traced`` (the whole step replayed from its trace, our kernels in it:
    `engine.compiled`; its switches are its own), ``ours+traced+fused`` (the same with each block's q, k, v,
    its MLP's gate, up and activation, and one token's norms and RoPE in one launch each: ``qmv_fused``,
    ``rope_fused``; the block's residual adds in the o and down projections' launches: ``residual_fused``) and
    ``mlx+traced`` (MLX's kernels only, the window step traced: its attention is masked over the whole buffer);
    the traced rows' 8-bit attention is `attention` ("mma", "staged" or "transposed")."""
    from engine.compute import ComputePath
    from engine.decode_choice import DecodeKernels

    ours_traced = DecodeKernels(qmv=True, attention_mma=attention == "mma", attention_staged=attention == "staged",
                                attention_transposed=attention == "transposed", kv_write=True, step_traced=True,
                                attention_chunk=True, step_traced_bf16=True,
                                source="setting")
    fused = dataclasses.replace(ours_traced, qmv_fused=True, rope_fused=True, residual_fused=True)
    untraced = dataclasses.replace(fused, step_traced=False, step_traced_bf16=False, kv_write=False)
    return {"ours": path, "ours+fused": ComputePath(model, kernels=untraced, compiled=True),
            "ours+traced": ComputePath(model, kernels=ours_traced, compiled=True),
            "ours+traced+fused": ComputePath(model, kernels=fused, compiled=True),
            "mlx+traced": ComputePath(model, kernels=DecodeKernels(source="setting"), compiled=True)}


def switches(bits: int, ours: bool, attention: str = "mma") -> tuple[bool, bool, str]:
    """`decode_steps`' kernels for a cache of `bits`: our linears, and for 8-bit our `attention` ("mma", "staged"
    or "transposed", on tensor cores)."""
    return (ours, False, "cores") if bits == 16 or not ours else (ours, True, attention)


def measure(lengths: list[int], steps: int, shape_name: str, widths: tuple[int, ...] = (16, 8),
            only: frozenset[str] = frozenset(), attention: str = "mma") -> list[dict[str, Any]]:
    model, policy, path = step_model(shape_name)
    ours = mx.default_device() == mx.gpu  # our kernels are CUDA's; elsewhere the step is MLX's
    paths = step_paths(model, path, attention)
    rows = []
    for context in lengths:
        for bits in widths:
            kernels = switches(bits, ours, attention)
            cache = filled_cache(model, policy, bits, context)
            decode_steps(path, cache, 2, kernels, "sync", attempts=1)  # the buffers grow once, untimed
            writes = ("mlx", "ours", "ours+traced", "ours+traced+fused") if bits == 8 else \
                ("mlx", "ours+traced", "ours+traced+fused")
            writes = (*writes, "mlx-only", "mlx-only+traced") if ours else ("mlx", "mlx+traced")
            if paths["mlx+traced"].decode_step is None:  # on CUDA the engine traces nothing with MLX's kernels
                writes = tuple(w for w in writes if w not in ("mlx+traced", "mlx-only+traced"))
            writes = tuple(w for w in writes if not only or w in only)
            for write in writes:
                row: dict[str, Any] = {"context": context, "kv_bits": bits, "write": write}
                step_path = paths.get(write) or (paths["mlx+traced"] if write.endswith("+traced") else path)
                step_kernels = (False, False, "cores") if write.startswith("mlx-only") else kernels
                for mode in MODES:
                    times = decode_steps(step_path, cache, steps, step_kernels, mode,
                                         attempts=3, kv_write=write.startswith("ours"))
                    row[f"{mode}_ms"] = times.seconds * 1e3
                    if mode == "pipelined":
                        row["pipelined_host_ms"], row["pipelined_python_ms"] = times.host * 1e3, times.python * 1e3
                if write == "mlx":
                    with writes_skipped(qkv.QuantizedKVStore if bits == 8 else qkv.DenseKVStore):
                        for mode in MODES[:2]:
                            row[f"{mode}_no_write_ms"] = decode_steps(path, cache, steps, kernels, mode,
                                                                      attempts=3).seconds * 1e3
                rows.append(row)
                print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
            del cache
            mx.clear_cache()
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--shape", default="qwen3-32b", help="bench/prefill.py's shape (tiny: a CPU smoke run)")
    ap.add_argument("--bits", default="16,8", help="cache widths, in the order measured (a process's history matters)")
    ap.add_argument("--writes", default="", help="only these rows (comma-separated names, as the rows' 'write')")
    ap.add_argument("--attention", choices=("mma", "staged", "transposed"), default="mma",
                    help="our 8-bit attention on tensor cores: engine/cuda_attention_mma.py, _staged.py or "
                         "_transposed.py")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_step.json"))
    a = ap.parse_args(argv)
    result = {"mlx": mx.__version__, "device": str(mx.default_device()),
              "mlx_env": mlx_env.current(), "attention": a.attention,
              "shape": a.shape, "rows": measure([int(x) for x in a.lengths.split(",")], a.steps, a.shape,
                              tuple(int(b) for b in a.bits.split(",")),
                              frozenset(w for w in a.writes.split(",") if w), a.attention)}
    save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
