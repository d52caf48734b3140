"""Engine speed on the default model: codectx vs mlx-lm vs llama.cpp, in one run.

For each prompt length, the three systems run the same token ids one after the
other (so a busy, shared CPU hurts them alike; read the ratios):

- ``codectx``: `engine.Engine` (fresh per prompt, so the prefill is cold).
- ``codectx-nocompile`` (opt-in): the same with the compiled decode step off.
- ``mlx_lm``: mlx-lm's own `stream_generate` on the same converted weights
  (loaded with `mlx_lm.load` from the codectx model cache), same prefill chunk.
- ``llama.cpp``: llama-cpp-python on the same GGUF, `--threads` threads, when
  `llama_cpp` is importable (optional; it builds from source).

Prompts are raw token ids of this repository's source text (no chat template),
so the model continues code and rarely stops before `--decode` tokens.
Prefill tok/s = prompt tokens / time to the first token; decode tok/s counts
the tokens after the first over the time after the first.

    python bench/engine.py                       # 512, 2048, 6000 prompt tokens, 128 decoded
    python bench/engine.py --lengths 512 --decode 32 --no-llama

Prints a Markdown table and writes bench/results/engine-<utc>.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="512,2048,6000", help="prompt lengths in tokens")
    parser.add_argument("--decode", type=int, default=128, help="tokens to decode per prompt")
    parser.add_argument("--threads", type=int, default=2, help="BLAS threads (MLX) and llama.cpp threads")
    parser.add_argument("--prefill-chunk", type=int, default=256, help="prefill chunk for codectx and mlx_lm")
    parser.add_argument("--systems", default="codectx,mlx_lm,llama.cpp", help="which systems to run (also: codectx-nocompile)")
    parser.add_argument("--no-llama", action="store_true", help="skip llama.cpp even when installed")
    parser.add_argument("--blas", default="auto", help="BLAS under MLX's CPU matmuls: auto, off or a library path")
    return parser.parse_args()


ARGS = parse_args()
# This file is named engine.py: its folder must not shadow the `engine` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path[:0] = [str(ROOT)]
sys.path.append(str(ROOT / "bench"))

from engine import blas  # noqa: E402

blas.preload(ARGS.blas, ARGS.threads)  # before MLX is imported

import mlx.core as mx  # noqa: E402

from _common import corpus_ids, engine_run, machine, markdown_table, timed, write_json  # noqa: E402
from engine.compute import ComputeOptions  # noqa: E402
from engine.loading import load_model  # noqa: E402

Run = Callable[[list[int], int], dict[str, Any]]


def codectx_runner(loaded: Any, chunk: int, compiled: bool = True) -> Run:
    options = ComputeOptions(compile=compiled, blas=ARGS.blas, blas_threads=ARGS.threads)
    return lambda ids, max_tokens: engine_run(loaded, ids, max_tokens, chunk=chunk, options=options)


def mlx_lm_runner(model_dir: Path, chunk: int) -> Run:
    from mlx_lm import load, stream_generate

    model, tokenizer = load(str(model_dir))

    def run(ids: list[int], max_tokens: int) -> dict[str, Any]:
        responses = stream_generate(model, tokenizer, ids, max_tokens=max_tokens, prefill_step_size=chunk)
        return timed(1 for _ in responses)

    return run


def llama_runner(gguf: Path, threads: int) -> Run | None:
    try:
        import llama_cpp.llama_cpp as llama_cpp
        from llama_cpp import Llama
    except ImportError:
        return None
    # llama.cpp's AMX weight repacking ("extra buffer types") segfaults in decode on
    # this project's CPU VM; the plain CPU kernels are used instead.
    default_params = llama_cpp.llama_model_default_params

    def without_repacking():
        params = default_params()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_model_default_params = without_repacking
    try:
        llm = Llama(model_path=str(gguf), n_ctx=8192, n_threads=threads, n_threads_batch=threads,
                    verbose=False)
    finally:
        llama_cpp.llama_model_default_params = default_params

    def run(ids: list[int], max_tokens: int) -> dict[str, Any]:
        llm.reset()  # llama-cpp-python reuses a common prefix with the previous call
        chunks = llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, top_k=1, stream=True)
        return timed(1 for _ in chunks)

    return run


def main() -> None:
    lengths = [int(n) for n in ARGS.lengths.split(",")]
    loaded = load_model(None, progress=True)
    wanted = set(ARGS.systems.split(","))
    runners: dict[str, Run] = {}
    if "codectx" in wanted:
        runners["codectx"] = codectx_runner(loaded, ARGS.prefill_chunk)
    if "codectx-nocompile" in wanted:
        runners["codectx-nocompile"] = codectx_runner(loaded, ARGS.prefill_chunk, compiled=False)
    if "mlx_lm" in wanted:
        runners["mlx_lm"] = mlx_lm_runner(loaded.path, ARGS.prefill_chunk)
    gguf = next(loaded.path.glob("*.gguf"), None)
    if "llama.cpp" in wanted and not ARGS.no_llama and gguf is not None:
        llama = llama_runner(gguf, ARGS.threads)
        if llama is not None:
            runners["llama.cpp"] = llama

    ids = corpus_ids(loaded.tokenizer, 64 + sum(lengths))
    warmup, offset = ids[:64], 64
    for run in runners.values():
        run(warmup, 4)
    results: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in runners}
    for length in lengths:
        prompt, offset = ids[offset : offset + length], offset + length
        for name, run in runners.items():
            results[name][length] = run(prompt, ARGS.decode)
            print(f"{name:10s} {length:5d} tokens: prefill {length / results[name][length]['ttft_s']:7.1f} tok/s, "
                  f"decode {results[name][length]['decode_tps'] or 0:6.1f} tok/s "
                  f"({results[name][length]['decode_per_cpu_s'] or 0:.1f}/CPU-s)", file=sys.stderr, flush=True)

    print(render(results, lengths))
    payload = {"machine": machine(), "blas": blas.describe(), "mlx": mx.__version__,
               "args": vars(ARGS), "results": results}
    print(f"\nwrote {write_json('engine', payload)}", file=sys.stderr)


def render(results: dict[str, dict[int, dict[str, Any]]], lengths: list[int]) -> str:
    """Prefill and decode per system and length: tok/s (wall), tok per CPU-second, ratios to codectx."""
    rows = []
    for length in lengths:
        ours = results.get("codectx", {}).get(length)
        for name, by_length in results.items():
            r = by_length[length]
            row = [length, name, length / r["ttft_s"], length / r["ttft_cpu_s"], r["decode_tps"],
                   r["decode_per_cpu_s"], r["decode_tokens"]]
            if ours is not None:
                row += [_ratio(length / r["ttft_cpu_s"], length / ours["ttft_cpu_s"]),
                        _ratio(r["decode_per_cpu_s"], ours["decode_per_cpu_s"])]
            rows.append(row)
    headers = ["prompt", "system", "prefill tok/s", "prefill tok/CPU-s", "decode tok/s",
               "decode tok/CPU-s", "decoded", "prefill CPU ×codectx", "decode CPU ×codectx"]
    return markdown_table(headers[: len(rows[0])], rows)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


if __name__ == "__main__":
    main()
