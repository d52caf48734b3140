"""The in-place 8-bit cache write (`engine.cuda_kv_write`) on the GPU: measured and checked as the engine
does at load, then the same greedy decode with it on and off.

A Qwen3-shaped random model (head dim 128, 32 query heads over 4 KV heads, 8 layers, 4-bit), an
8-bit windowed cache, a 3,000-token prompt, 48 greedy tokens through `engine.generate` with our
decode kernels (quantized linears, tensor-core attention), the write on and off: the tokens and
the next step's logits are compared.

    # on the lent H200 (device tool, carry [".gpu"]):
    bash .gpu/install.sh && python3 bench/gpu_kv_write.py --out $OUT/gpu_kv_write.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import mlx_env  # noqa: E402

mlx_env.apply()

import mlx.core as mx  # noqa: E402

from bench._common import save_json  # noqa: E402
from bench.prefill import Shape, build_model  # noqa: E402
from engine import decode_measure, linear_mode  # noqa: E402
from engine.compute import ComputePath  # noqa: E402
from engine.decode_choice import DecodeKernels  # noqa: E402
from engine.generate import decode, prefill  # noqa: E402
from engine.sampling import greedy  # noqa: E402
from engine.window import WindowPolicy, make_window_cache  # noqa: E402

SHAPE = Shape("qwen3", dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=8, intermediate_size=2048,
                            num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6,
                            vocab_size=4096, max_position_embeddings=131072, rope_theta=1e6,
                            tie_word_embeddings=False), 4, "bfloat16", 1024, 1024, 512)


def greedy_runs(tokens: int = 48) -> dict[str, Any]:
    model = build_model(SHAPE, None)
    linear_mode.wire(model)
    ids = [(7 * i + 3) % 4000 for i in range(3000)]
    runs = []
    for kv_write in (False, True):
        cache = make_window_cache(model, WindowPolicy(True, 1024, 1024, 512, 0, "block"), kv_bits=8)
        path = ComputePath(model, kernels=DecodeKernels(True, False, "setting", attention_mma=True, kv_write=kv_write))
        generated = list(decode(path, cache, prefill(path, cache, ids, chunk_size=512), greedy, tokens))
        last = path.forward(mx.array([[generated[-1]]]), cache, logits="last").astype(mx.float32)
        runs.append((generated, last))
    (off, off_logits), (on, on_logits) = runs
    return {"tokens": tokens, "identical": off == on,
            "first_difference": next((i for i, (a, b) in enumerate(zip(off, on)) if a != b), None),
            "max_abs_logit_diff": float(mx.max(mx.abs(off_logits - on_logits))),
            "logit_std": float(mx.std(off_logits))}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_kv_write.json"))
    a = ap.parse_args(argv)
    mlx_seconds, ours_seconds = decode_measure.time_kv_write(64, 8, 128, mx.bfloat16, "mma").get("kv_write",
                                                                                               (None, None))
    result = {"mlx": mx.__version__, "device": str(mx.default_device()), "mlx_env": mlx_env.current(),
              "load_time_measure_ms": {"mlx": mlx_seconds and mlx_seconds * 1e3,
                                       "ours": ours_seconds and ours_seconds * 1e3},
              "greedy": greedy_runs()}
    print(result, flush=True)
    save_json(result, a.out)
    return result


if __name__ == "__main__":
    main()
