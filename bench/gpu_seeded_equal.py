"""Our CUDA kernels from the modules `engine.cuda_kernel_cache` writes against the modules MLX compiles: same logits?

`engine.cuda_kernel_cache` compiles our kernels itself (NVRTC, our stand-in for MLX's device header) and leaves the
result where MLX's loader looks. If that build made different machine code than MLX's own, the engine's numbers
would change with whether a module was seeded. This script runs one workload in three fresh processes, each with
its own MLX PTX cache folder:

- ``mlx``: seeding off (``CODECTX_CUDA_KERNEL_CACHE=0``), an empty folder: MLX compiles every kernel;
- ``seeding``: seeding as configured (on under the checked MLX versions), an empty folder: our modules are written
  and MLX loads them;
- ``seeded``: seeding as configured, the ``seeding`` process's folder: everything is loaded from disk.

The workload, on bench/prefill.py's random Qwen3-32B shape cut to ``--layers`` layers, every kernel ours
(``compute.kernels: codectx``, ``compute.linear: dequantized``) over an 8-bit cache: a ``--length``-token prompt in
chunks of 2,048, a 40-token question after it (the chunk attention over the cache), then ``--decode`` greedy steps
through the engine's decode loop (the traced step). Every logit row is kept (float32) and compared bit for bit with
the ``mlx`` process's. Each process builds the model once and reports the workload's wall time twice (the first
pass pays for compiling or loading the kernels; the second, over a fresh cache, does not) and, in the seeding
processes, the host time the wrapper adds to a launch (`SeedingKernel.__call__` around a stand-in that does
nothing, against the stand-in; `wrapper_cost`, which also runs alone on a CPU).

    # device tool, carry [".gpu"]:
    bash .gpu/install.sh > /dev/null 2>&1; python3 bench/gpu_seeded_equal.py --out $OUT/gpu_seeded_equal.json
    python bench/gpu_seeded_equal.py --small   # CPU smoke run: no CUDA kernels, so nothing is seeded
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROCESSES = (("mlx", "0", "mlx"), ("seeding", None, "seeding"), ("seeded", None, "seeding"))
"""(label, CODECTX_CUDA_KERNEL_CACHE or None for the default, whose PTX folder it uses)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny 4-bit qwen3 on the CPU (a smoke run)")
    ap.add_argument("--length", type=int, default=4096, help="prompt tokens")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--decode", type=int, default=16, help="greedy steps")
    ap.add_argument("--timeout", type=int, default=240, help="seconds each process may take")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a process's logits file
    ap.add_argument("--out", default="bench/results/gpu_seeded_equal.json")
    return ap.parse_args(argv)


def model_path(a: argparse.Namespace) -> Any:
    """The random model's compute path with every kernel ours (built once a process: the weights are seeded)."""
    from bench.gpu_workload import random_loaded
    from bench.prefill import SHAPES
    from engine.compute import choose
    from engine.compute_options import ComputeOptions

    loaded = random_loaded(SHAPES["tiny" if a.small else "qwen3-32b"], "seeded-equal", a.layers, a.length + 1024)
    return choose(loaded.model, ComputeOptions(kernels="codectx", linear="dequantized"))


def workload(a: argparse.Namespace, path: Any) -> tuple[list[Any], list[int]]:
    """The prompt, the question and the decode steps over a fresh 8-bit cache: every logit row (float32, NumPy)
    and the greedy tokens."""
    import mlx.core as mx
    import numpy as np

    from engine.generate import decode, prefill
    from engine.window import WindowPolicy, make_window_cache

    vocab = path.model.args.vocab_size
    rng = np.random.default_rng(0)
    prompt, question = rng.integers(256, vocab - 16, a.length), rng.integers(256, vocab - 16, 40)
    rows: list[Any] = []

    def recording(logits: mx.array) -> mx.array:
        rows.append(logits.astype(mx.float32))
        return mx.argmax(logits, axis=-1)

    cache = make_window_cache(path.model, WindowPolicy(enabled=False), 8, 64)
    rows.append(prefill(path, cache, prompt.tolist(), 2048).astype(mx.float32))
    logits = prefill(path, cache, question.tolist(), 2048)
    rows.append(logits.astype(mx.float32))
    tokens = list(decode(path, cache, logits, recording, a.decode))
    mx.eval(rows)
    return [np.array(r).reshape(-1) for r in rows], tokens


def wrapper_cost() -> dict[str, float]:
    """Host microseconds a launch through `SeedingKernel` takes over the bare call (a stand-in kernel, a template
    already seen)."""
    from engine.cuda_kernel_cache import Definition, SeedingKernel

    def stand_in(**_: Any) -> None:
        return None

    template = [("T", "bfloat16"), ("ROWS", 1), ("GROUP", 64)]
    wrapped = SeedingKernel(stand_in, Definition("probe", "", "", ("x",), ("y",)), None)
    wrapped._seen.add(tuple(template))
    kw = dict(inputs=[], template=template, output_shapes=[], output_dtypes=[], grid=(1, 1, 1),
              threadgroup=(32, 1, 1))
    best: dict[str, float] = {}
    for name, call in (("bare", stand_in), ("wrapped", wrapped)):
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(100_000):
                call(**kw)
            best[name] = min(best.get(name, 1e9), (time.perf_counter() - start) * 10)  # µs per call
    return dict(bare_us=round(best["bare"], 3), wrapped_us=round(best["wrapped"], 3),
                added_us=round(best["wrapped"] - best["bare"], 3))


def child(a: argparse.Namespace) -> None:
    import mlx.core as mx
    import numpy as np

    from engine import cuda_kernel_cache

    if not a.small:
        mx.set_default_device(mx.gpu)
    path, passes = model_path(a), []
    for _ in range(2):
        start = time.perf_counter()
        rows, tokens = workload(a, path)
        passes.append(round(time.perf_counter() - start, 2))
    np.savez(a.child, *rows)
    report = dict(pass_s=passes, tokens=tokens, seeding=cuda_kernel_cache.enabled(), mlx=mx.__version__,
                  wrapper=wrapper_cost() if cuda_kernel_cache.enabled() else None)
    print("RESULT " + json.dumps(report), flush=True)


def compare(reference: Any, other: Any) -> dict[str, Any]:
    """Rows that are not bit-identical, and the largest difference."""
    import numpy as np

    different = [i for i, (x, y) in enumerate(zip(reference, other)) if x.tobytes() != y.tobytes()]
    worst = max((float(np.max(np.abs(x - y))) for x, y in zip(reference, other)), default=0.0)
    return dict(rows=len(reference), rows_different=different, max_abs_diff=worst)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    if a.child:
        child(a)
        return {}
    import numpy as np

    from bench._common import save_json
    from engine.cuda_kernel_cache import SWITCH

    work = Path(tempfile.mkdtemp(prefix="seeded-equal-"))
    result: dict[str, Any] = dict(length=a.length, layers=a.layers, decode=a.decode, processes={})
    logits: dict[str, Any] = {}
    for label, switch, folder in PROCESSES:
        env = {k: v for k, v in os.environ.items() if k != SWITCH}  # the default unless the process sets it
        env.update(MLX_PTX_CACHE_DIR=str(work / f"ptx-{folder}"), CODECTX_HOME=str(work / "home"))
        if switch:
            env[SWITCH] = switch
        files = work / f"{label}.npz"
        argv_child = [sys.executable, __file__, "--child", str(files), "--length", str(a.length), "--layers",
                      str(a.layers), "--decode", str(a.decode)] + (["--small"] if a.small else [])
        start = time.perf_counter()
        try:
            done = subprocess.run(argv_child, env=env, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            result["processes"][label] = dict(error=f"past its {a.timeout} s limit")
            save_json(result, a.out, quiet=True)
            continue
        line = next((s for s in done.stdout.splitlines() if s.startswith("RESULT ")), None)
        if line is None:
            result["processes"][label] = dict(error=done.stderr[-2000:], returncode=done.returncode)
            save_json(result, a.out, quiet=True)
            continue
        row = json.loads(line[len("RESULT "):]) | dict(process_s=round(time.perf_counter() - start, 2))
        row["custom_kernel_modules"] = len(list((work / f"ptx-{folder}").rglob("custom_kernel*.ptx")))
        with np.load(files) as archive:
            logits[label] = [archive[k] for k in sorted(archive.files, key=lambda k: int(k.split("_")[1]))]
        if label != "mlx" and "mlx" in logits:
            row["against_mlx"] = compare(logits["mlx"], logits[label]) | dict(
                same_tokens=row["tokens"] == result["processes"]["mlx"]["tokens"])
        result["processes"][label] = row
        save_json(result, a.out, quiet=True)
        print(label, {k: v for k, v in row.items() if k != "tokens"}, file=sys.stderr, flush=True)
    save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
