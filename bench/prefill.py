"""Prefill throughput: dense vs windowed attention, full-precision vs 8-bit KV, in one run.

Builds a random-weight model (no download), prefills random token prompts of
each length in fixed-size chunks through `engine.window` caches, and reports
tokens/s, peak memory, KV bytes and achieved TFLOP/s per (mode, length).
Prints a Markdown table and writes JSON (default bench/results/prefill-<shape>-<device>.json).

    python bench/prefill.py                                   # tiny model, CPU, 8k/16k/32k
    python bench/prefill.py --shape qwen3-32b --lengths 32768,65536,131072 --device gpu

Modes: dense-16 (exact attention, KV in the model dtype), window-16 (block
window), query-16 (exact per-query window, masked), dense-8 / window-8 (8-bit KV).
A prompt is treated as a cold request: positions from length - tail on are dense.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import blas_arguments, preload_blas  # noqa: E402

preload_blas()  # before MLX is imported (--blas off on a GPU: no CPU matmuls to speed up)

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from engine import linear_mode  # noqa: E402
from engine.window import WindowPolicy, make_window_cache, set_dense_from  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A model shape plus the window settings that suit its context lengths."""

    module: str
    args: dict
    weight_bits: int | None  # None: keep the dtype's full weights
    dtype: str
    global_tokens: int
    window_tokens: int
    dense_tail: int


SHAPES = {
    # Small enough for a shared 2-core CPU; G/W scaled to 1/8 of 32k like 8k+8k is of 128k.
    "tiny": Shape(
        "llama",
        dict(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
             num_attention_heads=2, num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-5,
             vocab_size=1024, max_position_embeddings=131072, rope_theta=1e6),
        None, "float32", 2048, 2048, 512,
    ),
    # Qwen3-32B's published shape, random weights, 4-bit (group 64) like mlx-community repos.
    "qwen3-32b": Shape(
        "qwen3",
        dict(model_type="qwen3", hidden_size=5120, num_hidden_layers=64, intermediate_size=25600,
             num_attention_heads=64, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
             vocab_size=151936, max_position_embeddings=131072, rope_theta=1e6,
             tie_word_embeddings=False),
        4, "bfloat16", 8192, 8192, 2048,
    ),
}

MODES = {  # name -> (window form or None for dense, kv bits)
    "dense-16": (None, 16),
    "window-16": ("block", 16),
    "query-16": ("query", 16),
    "dense-8": (None, 8),
    "window-8": ("block", 8),
}


def build_model(shape: Shape, layers: int | None, seed: int = 0) -> nn.Module:
    """Random weights, materialized one layer at a time to bound peak memory."""
    import importlib

    mod = importlib.import_module(f"mlx_lm.models.{shape.module}")
    args = dict(shape.args)
    if layers:
        args["num_hidden_layers"] = layers
    mx.random.seed(seed)
    model = mod.Model(mod.ModelArgs.from_dict(args))
    model.set_dtype(getattr(mx, shape.dtype))
    parts = [*model.layers, model]  # the model last: embeddings, norm, head
    for part in parts:
        if shape.weight_bits:
            nn.quantize(part, group_size=64, bits=shape.weight_bits)
        mx.eval(part.parameters())
    return model


def attention_flops(n: int, chunk: int, policy: WindowPolicy, dense_from: int) -> float:
    """Multiply-adds x2 of QK^T and PV per head-dim unit, summed over queries."""
    total = 0
    g, w = policy.global_tokens, policy.window_tokens
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        for q in range(start, start + size):
            seen = q + 1
            windowed = policy.enabled and q < dense_from and (
                (policy.form == "block" and start + size <= dense_from and start - w > g)
                or (policy.form == "query" and q - w > g))
            if windowed:
                seen = g + (q - (start if policy.form == "block" else q) + w + 1)
            total += seen
    return 4.0 * total  # x n_heads x head_dim x layers by the caller


def linear_flops_per_token(model: nn.Module) -> float:
    """2 x parameters of the transformer blocks' linear layers (embeddings excluded)."""
    count = 0
    for layer in model.layers:
        for _, m in layer.named_modules():
            if isinstance(m, (nn.Linear, nn.QuantizedLinear)):
                count += m.weight.shape[0] * (m.weight.shape[1] * (32 // m.bits if hasattr(m, "bits") else 1))
    return 2.0 * count


def prefill(model, tokens: mx.array, caches, chunk: int, linear: str = "quantized") -> float:
    """Seconds to prefill `tokens` chunk by chunk (logits of the chunks are never computed).

    With `linear` "dequantized", chunks multiply with weights dequantized per call
    (`engine.linear_mode`, the engine's own path; the model must be wired).
    """
    tic = time.perf_counter()
    for start in range(0, tokens.shape[1], chunk):
        with linear_mode.dequantized_linears(linear == "dequantized" and chunk >= linear_mode.LADDER[0]):
            model.model(tokens[:, start:start + chunk], cache=caches)
        mx.eval([c.state for c in caches])
    return time.perf_counter() - tic


def build_parser() -> argparse.ArgumentParser:
    """The command line: shape, lengths, device, modes and the prefill settings."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--lengths", default="8192,16384,32768")
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--chunk", type=int, default=None, help="prefill chunk (default 512 cpu, 2048 gpu)")
    ap.add_argument("--window", default=None, help="G,W (default: the shape's)")
    ap.add_argument("--tail", type=int, default=None, help="dense tail (default: the shape's)")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (smoke runs)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="device peak for the fraction column (default 989 on gpu: H200 dense bf16)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="tokens prefilled untimed per mode first (default: enough for windowed chunks on gpu, 0 on cpu)")
    ap.add_argument("--linear", choices=("quantized", "dequantized"), default="quantized",
                    help="dequantized: prefill chunks multiply with dequantized weights (engine.linear_mode; "
                         "the engine chooses by measurement, see bench/gpu_engine.py)")
    ap.add_argument("--out", default=None)
    blas_arguments(ap)
    return ap


@dataclass(frozen=True)
class Settings:
    """One run's prefill settings: the command line's, or the device's and the shape's defaults."""

    chunk: int
    global_tokens: int
    window_tokens: int
    tail: int
    peak: float | None  # TFLOP/s of the device, for the fraction column
    linear: str
    warmup: int

    @classmethod
    def resolve(cls, a: argparse.Namespace, shape: Shape) -> Settings:
        """The settings for the parsed command line `a` and its `shape`."""
        gpu = a.device == "gpu"
        chunk = a.chunk or (2048 if gpu else 512)
        g, w = map(int, a.window.split(",")) if a.window else (shape.global_tokens, shape.window_tokens)
        tail = shape.dense_tail if a.tail is None else a.tail
        warmup = a.warmup
        if warmup is None:
            warmup = g + w + 2 * chunk + tail + chunk if gpu else 0
        return cls(chunk, g, w, tail, a.peak_tflops or (989.0 if gpu else None), a.linear, warmup)


def modes_of(ap: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The ``--modes`` asked for (the parser exits on an unknown one)."""
    modes = [m for m in a.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}; choose from {list(MODES)}")
    return modes


def prepared_model(shape: Shape, layers: int | None, linear: str) -> tuple[nn.Module, float, float]:
    """The random-weight model (linears dequantized if asked), its linear FLOPs per token, build seconds."""
    build_s = time.perf_counter()
    model = build_model(shape, layers)
    lin = linear_flops_per_token(model)
    if linear == "dequantized":
        linear_mode.wire(model)
    return model, lin, time.perf_counter() - build_s


def warm_up(model: nn.Module, modes: list[str], s: Settings) -> None:
    """Prefill `s.warmup` tokens untimed in every mode: kernel compilation (JIT on CUDA) is not prefill time."""
    tokens = mx.random.randint(0, model.args.vocab_size, (1, s.warmup), key=mx.random.key(0))
    for mode in modes:
        form, bits = MODES[mode]
        caches = make_window_cache(model, WindowPolicy(enabled=form is not None, global_tokens=s.global_tokens,
                                                       window_tokens=s.window_tokens, form=form or "block"), bits)
        set_dense_from(caches, max(0, s.warmup - s.tail))
        prefill(model, tokens, caches, s.chunk, s.linear)
        del caches


def measure_mode(model: nn.Module, tokens: mx.array, mode: str, s: Settings, lin: float) -> dict:
    """Prefill `tokens` as a cold request in `mode`: the row of the results."""
    n = tokens.shape[1]
    heads, hd, n_layers = model.args.num_attention_heads, model.args.head_dim, model.args.num_hidden_layers
    form, bits = MODES[mode]
    policy = WindowPolicy(enabled=form is not None, global_tokens=s.global_tokens, window_tokens=s.window_tokens,
                          dense_tail=s.tail, form=form or "block")
    caches = make_window_cache(model, policy, bits)
    dense_from = max(0, n - s.tail)
    set_dense_from(caches, dense_from)
    mx.clear_cache()
    mx.reset_peak_memory()
    secs = prefill(model, tokens, caches, s.chunk, s.linear)
    flops = n * lin + attention_flops(n, s.chunk, policy, dense_from) * heads * hd * n_layers
    row = dict(mode=mode, linear=s.linear, tokens=n, seconds=round(secs, 3), tok_s=round(n / secs, 1),
               peak_gib=round(mx.get_peak_memory() / 2**30, 3),
               kv_gib=round(sum(c.nbytes for c in caches) / 2**30, 3),
               tflops=round(flops / secs / 1e12, 3))
    if s.peak:
        row["peak_fraction"] = round(row["tflops"] / s.peak, 4)
    return row


def measure_length(model: nn.Module, n: int, modes: list[str], s: Settings, lin: float) -> list[dict]:
    """One random prompt of `n` tokens prefilled in every mode; each row also goes to stderr."""
    tokens = mx.random.randint(0, model.args.vocab_size, (1, n), key=mx.random.key(n))
    rows = []
    for mode in modes:
        row = measure_mode(model, tokens, mode, s, lin)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def run(argv: list[str] | None = None) -> dict:
    """Prefill every length in every mode, write the JSON and print the table.

    Args:
        argv: The command line (default: ``sys.argv[1:]``).

    Returns:
        The results: the settings and one row per (length, mode).
    """
    ap = build_parser()
    a = ap.parse_args(argv)
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    shape = SHAPES[a.shape]
    s = Settings.resolve(a, shape)
    lengths = [int(x) for x in a.lengths.split(",")]
    modes = modes_of(ap, a)
    model, lin, build_s = prepared_model(shape, a.layers, a.linear)
    if s.warmup:
        warm_up(model, modes, s)
    rows = [row for n in lengths for row in measure_length(model, n, modes, s, lin)]
    result = dict(shape=a.shape, device=a.device, chunk=s.chunk, global_tokens=s.global_tokens,
                  window_tokens=s.window_tokens, dense_tail=s.tail, layers=model.args.num_hidden_layers,
                  linear=a.linear, weight_bits=shape.weight_bits, dtype=shape.dtype, build_s=round(build_s, 1),
                  mlx=mx.__version__, platform=platform.platform(), peak_tflops=s.peak, rows=rows)
    out = Path(a.out or f"bench/results/prefill-{a.shape}-{a.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(result))
    return result


def table(result: dict) -> str:
    """Markdown table: one row per length, tok/s (and ratio to dense-16) per mode."""
    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    by = {(r["mode"], r["tokens"]): r for r in result["rows"]}
    lengths = sorted({r["tokens"] for r in result["rows"]})
    head = "| tokens | " + " | ".join(f"{m} tok/s (peak GiB)" for m in modes) + " |"
    lines = [head, "|" + "---|" * (len(modes) + 1)]
    for n in lengths:
        base = by.get(("dense-16", n))
        cells = []
        for m in modes:
            r = by[(m, n)]
            ratio = f" {r['tok_s'] / base['tok_s']:.2f}x" if base and m != "dense-16" else ""
            cells.append(f"{r['tok_s']:,.0f}{ratio} ({r['peak_gib']:.2f})")
        lines.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    run()
