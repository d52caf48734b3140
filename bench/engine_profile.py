"""Where one decode step's time goes, on the default model (CPU time, so a busy CPU matters less).

Measures, per one-token step at a given context:

- ``step``: the model call plus argmax, plain and through `engine.compiled`;
- ``ops only``: the same 30-layer graph with tiny dimensions (hidden 64, vocab 512),
  i.e. the per-op cost of dispatching the graph without the arithmetic;
- ``weights only``: x @ W.T for every linear weight and the tied lm_head, as one
  graph: the cost of streaming the float32 weights from memory once;
- ``lm_head``: the tied-embedding projection alone (49152 x 576).

    python bench/engine_profile.py --context 512 --steps 30 [--blas-threads 1]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path[:0] = [str(ROOT)]
sys.path.append(str(ROOT / "bench"))

from _common import preload_blas  # noqa: E402

preload_blas()  # before MLX is imported

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models import llama  # noqa: E402

from _common import blas_arguments, machine, markdown_table, write_json  # noqa: E402
from engine import blas  # noqa: E402
from engine.compiled import CompiledDecodeStep  # noqa: E402
from engine.kv import make_cache  # noqa: E402
from engine.loading import load_model  # noqa: E402


def cpu_ms(fn, steps: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of `fn`, which must evaluate its own result."""
    for _ in range(3):
        fn()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.process_time() - cpu) / steps * 1e3, (time.perf_counter() - wall) / steps * 1e3


def stepper(model, context: int, compiled: bool):
    cache = make_cache(model)
    ids = (mx.arange(context) % 1000 + 5).astype(mx.uint32)[None]
    for start in range(0, context, 256):
        model(ids[:, start : start + 256], cache=cache)
        mx.eval([c.state for c in cache])
    call = CompiledDecodeStep(model) if compiled else (lambda t, c: model(t, cache=c))
    token = mx.array([[7]], dtype=mx.uint32)

    def step():
        # Trim back so every step runs at the same context.
        mx.argmax(call(token, cache)[:, -1, :], axis=-1).item()
        for c in cache:
            c.trim(1)

    return step


def tiny_like(args: llama.ModelArgs) -> nn.Module:
    tiny = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=args.num_hidden_layers,
                           intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                           rms_norm_eps=args.rms_norm_eps, vocab_size=512, rope_traditional=True,
                           tie_word_embeddings=True)
    model = llama.Model(tiny)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=30)
    blas_arguments(parser)
    args = parser.parse_args()
    model = load_model(None, progress=True).model
    weights = [m.weight for _, m in model.named_modules() if isinstance(m, nn.Linear)]
    head = model.model.embed_tokens.weight
    x = {w.shape[1]: mx.ones((1, w.shape[1])) for w in weights + [head]}
    tiny = tiny_like(model.args)
    rows = []
    for name, fn in [
        ("step (plain)", stepper(model, args.context, compiled=False)),
        ("step (compiled)", stepper(model, args.context, compiled=True)),
        ("ops only, tiny dims (plain)", stepper(tiny, args.context, compiled=False)),
        ("ops only, tiny dims (compiled)", stepper(tiny, args.context, compiled=True)),
        ("weights only: all matvecs, one graph", lambda: mx.eval([x[w.shape[1]] @ w.T for w in weights + [head]])),
        ("lm_head matvec", lambda: mx.eval(x[head.shape[1]] @ head.T)),
    ]:
        cpu, wall = cpu_ms(fn, args.steps)
        rows.append([name, cpu, wall])
        print(f"{name:40s} {cpu:8.1f} CPU ms {wall:8.1f} wall ms", file=sys.stderr, flush=True)
    megabytes = sum(w.nbytes for w in weights + [head]) / 1e6
    print(markdown_table(["per decode step", "CPU ms", "wall ms"], rows))
    print(f"\nfloat32 weights streamed per token: {megabytes:.0f} MB", file=sys.stderr)
    payload = {"machine": machine(), "blas": blas.describe(), "threads": blas.describe()["threads"],
               "context": args.context, "weights_mb": megabytes, "rows": rows}
    print(f"wrote {write_json('engine-profile', payload)}", file=sys.stderr)


if __name__ == "__main__":
    main()
