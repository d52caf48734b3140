"""Helpers shared by the benchmarks: a Markdown table, the machine's description, JSON results,
the BLAS start-up step, a random-weight llama, and one cold request timed through the engine.

Benchmarks are scripts (not CI); each prints a table and writes its numbers to
``bench/results/`` so a later run can be compared with this one. A benchmark that
runs MLX calls `preload_blas()` before it imports MLX and adds `blas_arguments`
to its parser (``--blas``, ``--blas-threads``: the ``compute.blas*`` settings).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def blas_arguments(parser: argparse.ArgumentParser) -> None:
    """``--blas`` and ``--blas-threads``, read by `preload_blas` (engine.blas.preload)."""
    parser.add_argument("--blas", default="auto",
                        help="BLAS under MLX's CPU matmuls: auto, off (MLX's reference BLAS) or a library path")
    parser.add_argument("--blas-threads", type=int, default=0, help="BLAS threads (0: usable cores, at most 8)")


def preload_blas(argv: Sequence[str] | None = None) -> None:
    """Preload the BLAS that ``--blas`` / ``--blas-threads`` in `argv` ask for (call before importing MLX)."""
    parser = argparse.ArgumentParser(add_help=False)
    blas_arguments(parser)
    known, _ = parser.parse_known_args(argv)
    from engine import blas

    blas.preload(known.blas, known.blas_threads)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; floats get one decimal, None prints as an en dash."""

    def cell(value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, float):
            return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """CPU model, usable cores, load average and Python version: context for any number."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": cores, "load_average": load, "python": platform.python_version(),
            "platform": platform.platform()}


def cpu_ticks() -> list[int]:
    """The machine's CPU time counters (/proc/stat: user, nice, system, idle, iowait, irq,
    softirq, steal), or [] where there are none."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            return [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def steal_share(before: list[int], after: list[int]) -> float | None:
    """The share of CPU time the hypervisor took from this machine between two `cpu_ticks()`.

    On a shared host this is how contended the run was: the same work takes
    longer when it is high, so read a run's timings together with it.
    """
    if len(before) < 8 or len(after) < 8:
        return None
    delta = [b - a for a, b in zip(before, after)]
    total = sum(delta)
    return delta[7] / total if total > 0 else None


def write_json(name: str, payload: dict[str, Any], directory: Path = RESULTS_DIR) -> Path:
    """Write ``payload`` (plus a UTC timestamp) to ``<directory>/<name>-<timestamp>.json``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{stamp}.json"
    path.write_text(json.dumps({"utc": stamp, **payload}, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def corpus_ids(tokenizer: Any, needed: int) -> list[int]:
    """Token ids of this repository's Python sources in path order, at least `needed` of them."""
    ids: list[int] = []
    for path in sorted(ROOT.glob("**/*.py")):
        if ".venv" in path.parts or "results" in path.parts:
            continue
        ids += tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
        if len(ids) >= needed:
            return ids
    raise SystemExit(f"the repository holds fewer than {needed} tokens of Python")


def timed(stream: Iterator[int]) -> dict[str, Any]:
    """Consume a stream yielding token counts; time the first token and the rest.

    Besides wall time, the process's CPU time (all threads) is recorded: on a
    shared, oversubscribed CPU, tokens per CPU-second vary far less than
    tokens per second.
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    first = last = cpu_first = cpu_last = None
    tokens = 0
    for count in stream:
        if count == 0:
            continue
        now, cpu_now = time.perf_counter(), time.process_time()
        if first is None:
            first, cpu_first = now, cpu_now
        last, cpu_last, tokens = now, cpu_now, tokens + count
    if first is None:
        raise RuntimeError("no token was generated")
    rest = tokens - 1
    return {"ttft_s": first - start, "ttft_cpu_s": cpu_first - cpu_start, "decode_tokens": tokens,
            "decode_tps": rest / (last - first) if rest > 0 and last > first else None,
            "decode_per_cpu_s": rest / (cpu_last - cpu_first) if rest > 0 and cpu_last > cpu_first else None}


def engine_run(loaded: Any, ids: list[int], max_tokens: int, *, chunk: int, options: Any) -> dict[str, Any]:
    """One cold request (`ids`, then up to `max_tokens` decoded) through a fresh `engine.Engine` on
    `loaded` with `options` (engine.compute.ComputeOptions): `timed` plus the engine's own metrics."""
    from engine.engine import Engine
    from engine.request import Request, TokenEvent

    with Engine(loaded, prefill_chunk=chunk, compute=options) as eng:
        handle = eng.submit(Request(prompt_ids=ids, max_tokens=max_tokens))
        result = timed(len(e.token_ids) for e in handle if isinstance(e, TokenEvent))
        metrics = handle.result().metrics
    assert metrics.recomputed_tokens == len(ids), "the benchmark needs a cold prefill"
    result["internal"] = metrics.as_dict()
    return result


def run_sections(runners: Mapping[str, Callable[[], None]], names: Sequence[str], result: dict, out: str) -> None:
    """Run the named sections in order, writing `result` to `out` after each; a section that fails
    is printed and recorded under ``errors`` (the others still run)."""
    for name in names:
        try:
            runners[name]()
        except Exception as err:  # noqa: BLE001 - one failing section must not lose the others
            import traceback
            traceback.print_exc()
            result.setdefault("errors", {})[name] = repr(err)
        save_json(result, out, quiet=True)
    print(f"wrote {out}")


def save_json(result: dict, out: str, quiet: bool = False) -> None:
    """Write `result` as indented JSON to `out` (its folder made)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1, default=str))
    if not quiet:
        print(f"wrote {out}")


def random_llama(layers: int, hidden: int, mlp: int, heads: int, kv_heads: int, head_dim: int, vocab: int) -> Any:
    """A random-weight mlx-lm llama of these widths (float32, tied embeddings), evaluated. (Imports MLX: call it
    after `preload_blas`.)"""
    import mlx.core as mx
    from mlx_lm.models import llama

    model = llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=mlp,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-5,
        vocab_size=vocab, rope_traditional=False, tie_word_embeddings=True))
    mx.eval(model.parameters())
    return model


def llama_tools_folder() -> Path:
    """The folder scripts/build-llama-server.sh builds llama.cpp's tools into (its `--where`: the script
    alone names it, from the version and the instruction set it builds for)."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "scripts" / "build-llama-server.sh"
    out = subprocess.run(["bash", str(script), "--where"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())
