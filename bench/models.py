"""Model files benchmark: the default model in each GGUF quantisation, codectx against llama.cpp.

The default model's GGUF (Q4_1) is requantized with llama.cpp's `llama-quantize --allow-requantize`
into each type below (so every variant derives from the Q4_1 weights, and quality is measured
against the Q4_1 file dequantized exactly). Per file, in one run, one after the other:

- ``llama.cpp``: `llama-bench -m FILE -p PROMPT -n DECODE -t THREADS` (prefill and decode tok/s,
  its peak RSS); the tools come from scripts/build-llama-server.sh.
- ``codectx`` per requantization target (``--bits``: `load_model(FILE, gguf_bits=B)`; ``default``
  is `load_model(FILE)` without it), each load in a fresh process, the run's conversions in a
  fresh `CODECTX_HOME` (removed afterwards): the first load (the conversion into the cache)
  timed; then a second process loads the cached conversion, records its RSS, times a cold
  PROMPT-token prefill and DECODE decoded tokens through `engine.Engine`
  (`bench._common.engine_run`), and measures quality: on the first
  ``--quality-tokens`` tokens of ``--quality-file``, the mean KL divergence of its next-token
  distributions from the reference's, the share of positions whose top-1 token agrees, and the
  perplexity of the text. The reference is the Q4_1 file loaded with ``--reference-bits``.

On a CPU, codectx dequantizes every loaded model to float32 (engine.loaded_model.weight_dtype),
so speed does not depend on the quantisation there; quality and memory may.

    python bench/models.py                                  # every type, --bits 4,8,32
    python bench/models.py --types Q4_1,Q2_K --bits 4 --prompt 128 --decode 16   # a quick check

Prints a Markdown table and writes bench/results/models-<utc>.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import blas_arguments, llama_tools_folder, machine, markdown_table, write_json  # noqa: E402

TYPES = "F16,Q8_0,Q6_K,Q5_K_M,Q5_0,Q4_K_M,Q4_1,Q4_0,Q3_K_M,Q2_K"
SOURCE_TYPE = "Q4_1"  # the default model's GGUF


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default=TYPES, help="GGUF types to produce and measure")
    parser.add_argument("--bits", default="4,8,32",
                        help="codectx requantization targets (4, 8, 16, 32; default: no gguf_bits)")
    parser.add_argument("--reference-bits", default="32", help="how the Q4_1 reference is loaded (32: float32, exact)")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens for prefill")
    parser.add_argument("--decode", type=int, default=128, help="tokens to decode")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (and --blas-threads by default)")
    parser.add_argument("--prefill-chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="timed requests per load; the best is kept")
    parser.add_argument("--quality-file", default="context/lru.py", help="text for the quality measure")
    parser.add_argument("--quality-tokens", type=int, default=300)
    parser.add_argument("--variants", type=Path, default=Path.home() / ".cache" / "codectx-dev" / "bench-models",
                        help="where the quantised GGUF files are kept between runs")
    parser.add_argument("--no-llama", action="store_true", help="skip llama-bench")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    blas_arguments(parser)
    args = parser.parse_args(argv)
    args.blas_threads = args.blas_threads or args.threads
    return args


# --- llama.cpp ---------------------------------------------------------------------------------

def llama_tools() -> Path:
    """The folder scripts/build-llama-server.sh fills with llama-quantize, llama-bench and their libraries."""
    folder = llama_tools_folder()
    missing = [t for t in ("llama-quantize", "llama-bench") if not (folder / t).is_file()]
    if missing:
        raise SystemExit(f"no {', '.join(missing)} in {folder}: run scripts/build-llama-server.sh")
    return folder


def run_measured(command: list[str], env: dict[str, str] | None = None) -> tuple[str, float, float | None]:
    """Run `command` to completion: (stdout, wall seconds, the process's peak RSS in MiB).

    The peak is the process's own VmHWM, read while it runs (the kernel's ru_maxrss would also
    count this Python process, whose memory the child carries until its exec).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # files: a full pipe would block it
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        peak = None
        while True:
            peak = _peak_rss_mib(process.pid) or peak
            try:
                process.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                continue
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text, errors = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if process.returncode != 0:
        raise RuntimeError(f"{command[0]} exited with {process.returncode}: {errors[-2000:]}")
    return text, wall, peak


def _peak_rss_mib(pid: int | str = "self") -> float | None:
    """VmHWM of a running process in MiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def make_variants(source: Path, types: list[str], folder: Path, tools: Path) -> dict[str, Path]:
    """`source` requantized into each type (kept in `folder`; a file already there is reused)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(tools)}
    files = {}
    for kind in types:
        if kind == SOURCE_TYPE:
            files[kind] = source
            continue
        target = folder / f"{source.name.split('.')[0]}.{kind}-from-{SOURCE_TYPE}.gguf"
        if not target.is_file():
            partial = target.with_suffix(".part")
            run_measured([str(tools / "llama-quantize"), "--allow-requantize", str(source), str(partial), kind],
                         env)
            partial.rename(target)
        files[kind] = target
    return files


def tensor_types(gguf: Path) -> dict[str, int]:
    """How many tensors of each GGML type `gguf` holds (llama-quantize falls back to another type
    for a tensor whose rows do not split into its blocks: K-quants need multiples of 256)."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(gguf).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def llama_bench(tools: Path, gguf: Path, args: argparse.Namespace) -> dict[str, Any]:
    """llama-bench's prefill and decode tok/s (mean over its repetitions) and its peak RSS."""
    command = [str(tools / "llama-bench"), "-m", str(gguf), "-p", str(args.prompt), "-n", str(args.decode),
               "-t", str(args.threads), "-o", "json"]
    text, wall, peak = run_measured(command, {**os.environ, "LD_LIBRARY_PATH": str(tools)})
    tests = json.loads(text)
    prefill = next(t for t in tests if t["n_prompt"] and not t["n_gen"])
    decode = next(t for t in tests if t["n_gen"] and not t["n_prompt"])
    return {"prefill_tps": prefill["avg_ts"], "prefill_sd": prefill["stddev_ts"], "decode_tps": decode["avg_ts"],
            "decode_sd": decode["stddev_ts"], "peak_rss_mib": peak, "wall_s": wall,
            "model_size": prefill.get("model_size"), "build": prefill.get("build_commit")}


# --- codectx, in a child process per load --------------------------------------------------------

def rss_mib() -> dict[str, float]:
    """This process's resident and peak resident memory (/proc/self/status), MiB."""
    fields = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                fields[line.split(":")[0]] = int(line.split()[1]) / 1024
    return {"rss_mib": fields.get("VmRSS"), "peak_rss_mib": fields.get("VmHWM")}


def quality_ids(tokenizer: Any, args: argparse.Namespace) -> tuple[list[int], str]:
    """The first --quality-tokens tokens of --quality-file, and the SHA-256 of that file's text."""
    text = (ROOT / args.quality_file).read_text(encoding="utf-8")
    ids = tokenizer.encode(text)[: args.quality_tokens]
    if len(ids) < args.quality_tokens:
        raise SystemExit(f"{args.quality_file} holds only {len(ids)} tokens")
    return ids, hashlib.sha256(text.encode()).hexdigest()[:16]


def log_probs(model: Any, ids: list[int]) -> Any:
    """Next-token log-probabilities (float32, one row per position) of `ids` in one forward."""
    import mlx.core as mx

    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def quality(loaded: Any, args: argparse.Namespace, reference: Path | None) -> dict[str, Any]:
    """KL divergence from and top-1 agreement with the reference's log-probs, and the text's perplexity;
    with `reference` None, this model's log-probs are written there instead (`--child` "save")."""
    import mlx.core as mx
    import numpy as np

    ids, digest = quality_ids(loaded.tokenizer, args)
    ours = log_probs(loaded.model, ids)
    nll = -mx.take_along_axis(ours[:-1], mx.array(ids[1:])[:, None], axis=-1).mean().item()
    result: dict[str, Any] = {"tokens": len(ids), "text_sha256": digest, "perplexity": float(np.exp(nll))}
    if reference is None:
        return {**result, "log_probs": np.array(ours)}
    ref = mx.array(np.load(reference))
    kl = (mx.exp(ref) * (ref - ours)).sum(axis=-1)
    agree = (mx.argmax(ref, axis=-1) == mx.argmax(ours, axis=-1)).astype(mx.float32)
    return {**result, "kl_mean": kl.mean().item(), "kl_max": kl.max().item(), "top1_agree": agree.mean().item()}


def speed(loaded: Any, args: argparse.Namespace) -> dict[str, Any]:
    """A cold --prompt-token prefill and --decode decoded tokens through the engine (after a warm-up),
    --repeats times, each on a fresh engine: the best rates (a shared machine only slows a run down)."""
    from bench._common import corpus_ids, engine_run
    from engine.compute import ComputeOptions

    options = ComputeOptions(blas=args.blas, blas_threads=args.blas_threads)
    ids = corpus_ids(loaded.tokenizer, 64 + args.prompt)
    engine_run(loaded, ids[:64], 4, chunk=args.prefill_chunk, options=options)
    runs = [engine_run(loaded, ids[64 : 64 + args.prompt], args.decode, chunk=args.prefill_chunk, options=options)
            for _ in range(args.repeats)]
    return {"prefill_tps": max(args.prompt / r["ttft_s"] for r in runs),
            "decode_tps": max(r["decode_tps"] or 0.0 for r in runs), "decoded": [r["decode_tokens"] for r in runs],
            "ttft_s": [r["ttft_s"] for r in runs]}


def conversion_facts(gguf: str, bits: str) -> dict[str, Any]:
    """The cached conversion's weight bytes and its modules held at other than the target bits
    (config.json's per-module quantization: the loader keeps finer GGUF tensors at 8 bits)."""
    from engine.gguf import DEFAULT_GGUF_BITS
    from engine.gguf_convert import converted_dir

    directory = converted_dir(Path(gguf), DEFAULT_GGUF_BITS if bits == "default" else int(bits))
    weights = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    quantization = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("quantization") or {}
    overrides: dict[str, int] = {}
    for value in quantization.values():
        if isinstance(value, dict) or value is False:
            key = f"{value['bits']}-bit" if value else "float"
            overrides[key] = overrides.get(key, 0) + 1
    return {"weights_mib": weights / 2**20, "module_overrides": overrides}


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One load in this fresh process (`--child` JSON: file, bits, mode "load", "measure" or "save",
    reference); prints its numbers as JSON on stdout's last line."""
    spec = json.loads(args.child)
    from bench._common import preload_blas

    preload_blas(["--blas", args.blas, "--blas-threads", str(args.blas_threads)])
    import mlx.core as mx

    from engine.loading import load_model

    extra = {} if spec["bits"] == "default" else {"gguf_bits": int(spec["bits"])}
    before = rss_mib()["rss_mib"]
    start = time.perf_counter()
    loaded = load_model(spec["file"], progress=False, **extra)
    result: dict[str, Any] = {"load_s": time.perf_counter() - start, "rss_before_load_mib": before, **rss_mib(),
                              "weight_dtype": str(next(iter(_leaves(loaded.model.parameters()))).dtype),
                              "device": str(mx.default_device())}
    if spec["mode"] == "load":
        result["conversion"] = conversion_facts(spec["file"], spec["bits"])
    elif spec["mode"] == "save":
        measured = quality(loaded, args, None)
        import numpy as np

        np.save(spec["reference"], measured.pop("log_probs"))
        result["quality"] = measured
    elif spec["mode"] == "measure":
        result["quality"] = quality(loaded, args, Path(spec["reference"]))
        result["speed"] = speed(loaded, args)
    return result


def _leaves(tree: Any) -> Any:
    from mlx.utils import tree_flatten

    return (value for _, value in tree_flatten(tree))


def codectx_load(args: argparse.Namespace, spec: dict[str, Any], home: Path) -> dict[str, Any]:
    """`child` in a fresh process with CODECTX_HOME=`home`: its numbers, the process's wall time and peak RSS."""
    passed = {"--blas": args.blas, "--blas-threads": args.blas_threads, "--prompt": args.prompt,
              "--decode": args.decode, "--prefill-chunk": args.prefill_chunk, "--repeats": args.repeats,
              "--quality-file": args.quality_file, "--quality-tokens": args.quality_tokens}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec),
               *(str(part) for pair in passed.items() for part in pair)]
    text, wall, peak = run_measured(command, {**os.environ, "CODECTX_HOME": str(home)})
    return {**json.loads(text.strip().splitlines()[-1]), "process_wall_s": wall, "process_peak_rss_mib": peak}


def measure_file(args: argparse.Namespace, gguf: Path, home: Path, reference: Path) -> dict[str, Any]:
    """Every --bits target on one file: the first load (conversion), then the cached load with speed and quality."""
    results = {}
    for bits in args.bits.split(","):
        spec = {"file": str(gguf), "bits": bits, "reference": str(reference)}
        first = codectx_load(args, {**spec, "mode": "load"}, home)
        cached = codectx_load(args, {**spec, "mode": "measure"}, home)
        results[bits] = {"first": first, "cached": cached}
        q, s = cached["quality"], cached["speed"]
        print(f"  codectx {bits:>6}: first load {first['load_s']:.2f} s, cached {cached['load_s']:.2f} s, "
              f"RSS {cached['rss_mib']:.0f} MiB, prefill {s['prefill_tps']:.0f} tok/s, decode "
              f"{s['decode_tps'] or 0:.1f} tok/s, KL {q['kl_mean']:.2e}, top-1 {q['top1_agree']:.3f}",
              file=sys.stderr, flush=True)
    return results


# --- the run -------------------------------------------------------------------------------------

def default_gguf() -> Path:
    """The default model's GGUF in codectx's cache (fetched there on first use)."""
    from engine.default_model import ensure_default_model

    return ensure_default_model(progress=True).gguf


def run(args: argparse.Namespace) -> dict[str, Any]:
    tools = llama_tools()
    source = default_gguf()
    files = make_variants(source, args.types.split(","), args.variants, tools)
    home = Path(tempfile.mkdtemp(prefix="codectx-bench-models-"))
    try:
        reference = home / "reference-log-probs.npy"
        ref = codectx_load(args, {"file": str(source), "bits": args.reference_bits, "mode": "save",
                                  "reference": str(reference)}, home / "reference")  # not the runs' cache
        rows: dict[str, Any] = {}
        for kind, gguf in files.items():
            print(f"{kind} ({gguf.stat().st_size / 2**20:.1f} MiB)", file=sys.stderr, flush=True)
            row: dict[str, Any] = {"file": str(gguf), "size_mib": gguf.stat().st_size / 2**20,
                                   "tensor_types": tensor_types(gguf)}
            if not args.no_llama:
                row["llama.cpp"] = llama_bench(tools, gguf, args)
                print(f"  llama.cpp: prefill {row['llama.cpp']['prefill_tps']:.0f} tok/s, decode "
                      f"{row['llama.cpp']['decode_tps']:.1f} tok/s", file=sys.stderr, flush=True)
            row["codectx"] = measure_file(args, gguf, home / "runs", reference)
            rows[kind] = row
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {"source": str(source), "reference": ref, "types": rows}


def render(result: dict[str, Any]) -> str:
    """One row per file and codectx target: load times, memory, speed of both systems, quality."""
    table = []
    for kind, row in result["types"].items():
        llama = row.get("llama.cpp") or {}
        for bits, runs in row["codectx"].items():
            first, cached = runs["first"], runs["cached"]
            q, s = cached["quality"], cached["speed"]
            table.append([kind, row["size_mib"], bits, first["conversion"]["weights_mib"], first["load_s"],
                          cached["load_s"], cached["rss_mib"], cached["process_peak_rss_mib"], s["prefill_tps"],
                          s["decode_tps"],
                          llama.get("prefill_tps"), llama.get("decode_tps"), llama.get("peak_rss_mib"),
                          f"{q['kl_mean']:.2e}", f"{q['top1_agree']:.3f}", q["perplexity"]])
    headers = ["GGUF", "MiB", "bits", "converted MiB", "first load s", "cached load s", "RSS after load MiB",
               "peak RSS MiB", "prefill tok/s", "decode tok/s", "llama.cpp prefill", "llama.cpp decode",
               "llama.cpp peak RSS", "KL", "top-1", "ppl"]
    return markdown_table(headers, table)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args), default=str))
        return
    started = time.strftime("%H:%M:%S", time.gmtime())
    result = run(args)
    print(render(result))
    payload = {"machine": machine(), "started_utc": started, "args": vars(args), **result}
    print(f"\nwrote {write_json('models', payload)}", file=sys.stderr)


if __name__ == "__main__":
    main()
