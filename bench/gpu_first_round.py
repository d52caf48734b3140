"""What a process's first speculative round waits for: the kernels it compiles, MLX's and ours told apart.

With 8-bit KV the first round that verifies drafts in a process stalled 6.5 s at 8,192 tokens and 8-12 s at
131,072 (docs/benchmarks.md, *GPU engine*, twenty-fourth and twenty-fifth sessions); a second process, with the
first's compiled kernels on disk, waited only about 5 s less. MLX's CUDA backend writes what it compiles for its own
operations under its PTX cache folder (``MLX_PTX_CACHE_DIR``, by default ``<tmp>/mlx/<version>/ptx``) and reads it back
in later processes; in MLX's source (``custom_kernel.cpp``) the kernels made with `mx.fast.cuda_kernel`, which all of
ours are (`engine.cuda_backend.kernel`), are compiled without that cache: every process compiles them again.

One process: an engine of configuration `--config` with speculation off asks once (the prefill's and decode's
kernels are built); then an engine with prompt-lookup speculation asks twice (its first round builds the verify
rounds' kernels; the second ask is the control). Recorded: each ask's token gaps, and the files MLX wrote to its PTX
cache folder while the speculating engine's first ask ran, with their times from the ask's start. Run it twice
against one folder (``--ptx-dir``): the second process finds MLX's own kernels on disk, so what its first round
still waits for is ours (plus tracing the verify step and the driver loading code).

    # device tool, carry [".gpu"]:
    bash .gpu/install.sh > /dev/null 2>&1; for i in 1 2; do python3 bench/gpu_first_round.py --ptx-dir /tmp/ptx --out $OUT/first_round-$i.json; done
    python bench/gpu_first_round.py --small     # CPU smoke run (no PTX folder is written on the CPU)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny 4-bit qwen3 on the CPU (a smoke run)")
    ap.add_argument("--length", type=int, default=8192, help="prompt tokens")
    ap.add_argument("--config", default="window-8", help="a bench/gpu_engine.py configuration")
    ap.add_argument("--decode", type=int, default=24, help="tokens decoded per ask")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count")
    ap.add_argument("--ptx-dir", default=None, help="MLX_PTX_CACHE_DIR for this process (set before MLX loads)")
    ap.add_argument("--out", default="bench/results/gpu_first_round.json")
    return ap.parse_args(argv)


def ptx_files(folder: Path | None) -> dict[str, tuple[float, int]]:
    """Every file under MLX's PTX cache folder: its modification time and size."""
    if folder is None or not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): (p.stat().st_mtime, p.stat().st_size) for p in folder.rglob("*") if p.is_file()}


def written(before: dict, after: dict, since: float) -> list[dict[str, Any]]:
    """The PTX modules written between two listings (one row per module: its ``.ptx`` file), seconds after `since`."""
    rows = [dict(module=name[:-4], at_s=round(mtime - since, 3), ptx_kib=round(size / 1024, 1))
            for name, (mtime, size) in after.items() if name.endswith(".ptx") and name not in before]
    return sorted(rows, key=lambda r: r["at_s"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    if a.ptx_dir:
        os.environ["MLX_PTX_CACHE_DIR"] = a.ptx_dir  # MLX reads it once, at its first compile
    from bench import gpu_engine
    from bench._common import save_json
    from bench.gpu_workload import synthetic_repository

    import mlx.core as mx

    engine_args = ["--lengths", str(a.length), "--configs", a.config, "--decode", str(a.decode)]
    engine_args += ["--small"] if a.small else ["--device", "gpu"]
    engine_args += ["--layers", str(a.layers)] if a.layers else []
    run = gpu_engine.Run(gpu_engine.parse_args(engine_args))
    mx.set_default_device(mx.gpu if run.a.device == "gpu" else mx.cpu)
    folder = Path(a.ptx_dir) if a.ptx_dir else None
    repo = synthetic_repository(a.length, run.model.args.vocab_size)
    found = ptx_files(folder)
    result: dict[str, Any] = dict(mlx=mx.__version__, device_info=mx.device_info(), length=a.length, config=a.config,
                                  layers=run.model.args.num_hidden_layers, ptx_dir=a.ptx_dir,
                                  ptx_files_at_start=len(found), asks=[])

    def one(eng: Any, label: str, seed: int) -> dict[str, Any]:
        before, start = ptx_files(folder), time.time()
        row = gpu_engine.ask(eng, repo.prompt(seed), a.decode)
        ids = row.pop("ids")
        row.update(label=label, ptx_written=written(before, ptx_files(folder), start))
        keep = ("label", "prompt", "restored", "ttft_s", "decode_tps", "drafted", "accepted", "token_gaps",
                "ptx_written")
        result["asks"].append({k: row[k] for k in keep} | {"ids": ids})
        save_json(result, a.out, quiet=True)  # after every ask: a process cut by a time limit keeps its rows
        print(label, {k: row[k] for k in keep if k != "ptx_written"}, f"{len(row['ptx_written'])} PTX modules",
              file=sys.stderr, flush=True)
        return row

    start = time.perf_counter()
    eng = run.engine(a.config, archive=False)  # its load-time measurements compile kernels too
    result["engine_start_s"] = [round(time.perf_counter() - start, 2)]
    save_json(result, a.out, quiet=True)
    one(eng, "plain ask", 1)
    gpu_engine.close(eng)
    del eng
    gpu_engine.free()
    start = time.perf_counter()
    eng = run.engine(a.config, speculation="lookup", archive=False)
    result["engine_start_s"].append(round(time.perf_counter() - start, 2))
    one(eng, "first speculating ask", 2)
    one(eng, "second speculating ask", 3)
    gpu_engine.close(eng)
    from engine import cuda_kernel_cache
    result["kernel_cache"] = cuda_kernel_cache.enabled()
    result["ptx_files_at_end"] = len(ptx_files(folder))
    result["custom_kernel_files"] = sorted(n for n in ptx_files(folder) if n.startswith("custom_kernel"))[:50]
    save_json(result, a.out, quiet=True)
    print(f"wrote {a.out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
