"""An 8-bit cache's rows on the GPU: dequantized for a prefill chunk, and copied out for a checkpoint.

`bench/gpu_kernels.py`'s ``rows`` section:

- ``dequant_rows``: the history a chunk of an edit + ask attends over (``--context`` + 1,037 rows of a 64-layer
  Qwen3-32B-shaped 8-bit store, keys and values) dequantized by `engine.cuda_dequant.rows_of` and by MLX's
  `mx.dequantize` (which copies the slice contiguous first), against a bf16 copy of the same output: time for
  the 128 calls of a forward, and the bytes read and written per second;
- ``span_copy``: a 45-row checkpoint copied out of every layer (`engine.state.copy_kv_span`, as a detach before
  an edit + ask does it), 8-bit and bf16: the host's and the device's time together, as the request waits for it.
  (A kernel copying a layer's six 8-bit arrays in one launch was measured here on the H100: 5.65 against 6.56 ms
  with 8-bit KV, 2.56 against 2.40 with bf16; MLX's custom-kernel call costs the host about as much as the copies
  it replaces. Not kept, so not reproducible from this tree.)

    bash .gpu/install.sh && python3 bench/gpu_kernels.py --sections rows --out $OUT/gpu_kernels.json
"""
from __future__ import annotations

import mlx.core as mx

from bench.gpu_attention import buffer_positions, median_ms
from engine import cuda_dequant, state

LAYERS, KV, DIM, GROUP = 64, 8, 128, 64


class _Layer:
    """A layer's cache as `engine.state` reads it: its `state` (views of its buffers) and `offset`."""

    def __init__(self, parts: list[mx.array], offset: int) -> None:
        self.parts, self.offset = parts, offset

    @property
    def state(self) -> list[mx.array]:
        return [a[..., :self.offset, :] for a in self.parts]


def _store(positions: int, bits: int) -> list[mx.array]:
    """One layer's buffers: (packed, scales, biases) for keys and values, or bf16 keys and values."""
    rows = mx.random.normal((1, KV, positions, DIM)).astype(mx.bfloat16)
    if bits == 16:
        return [rows, rows * 0.5]
    triple = list(mx.quantize(rows, group_size=GROUP, bits=bits))
    return [*triple, *(mx.array(a) for a in triple)]


def section_rows(result: dict, context: int, copy_gbs: float) -> None:
    _dequant_rows(result, context, copy_gbs)
    mx.clear_cache()
    for bits in (8, 16):
        _span_copy(result, context, bits)
        mx.clear_cache()


def _dequant_rows(result: dict, context: int, copy_gbs: float) -> None:
    end = context + 1037
    positions = buffer_positions(end)
    q8 = _store(positions, 8)
    mx.eval(q8)
    keys, values = tuple(q8[:3]), tuple(q8[3:])
    cut = lambda q: [a[..., :end, :] for a in q]  # noqa: E731 - as the store's read slices its buffers
    out_bytes = 2 * KV * end * DIM * 2
    in_bytes = sum(a[..., :end, :].nbytes for a in q8)
    variants = {
        "ours": lambda: [cuda_dequant.rows_of(*cut(q), bits=8, group_size=GROUP) for q in (keys, values)],
        "mlx": lambda: [mx.dequantize(*cut(q), group_size=GROUP, bits=8) for q in (keys, values)],
        "bf16 copy": lambda: [mx.contiguous(mx.zeros((1, KV, positions, DIM), mx.bfloat16)[..., :end, :])
                              for _ in range(2)]}
    mx.eval(variants["bf16 copy"]())
    for name, fn in variants.items():
        ms = median_ms(lambda: [x for _ in range(LAYERS) for x in fn()], 5, warmup=2)
        moved = (out_bytes * 2 if name == "bf16 copy" else out_bytes + in_bytes) * LAYERS
        row = {"rows": end, "variant": name, "ms_64_layers": round(ms, 3), "gbs": round(moved / ms / 1e6, 1),
               "copy_gbs": round(copy_gbs, 1)}
        result.setdefault("dequant_rows", []).append(row)
        print(f"dequant rows: {row}", flush=True)
    exact = [mx.array_equal(cuda_dequant.rows_of(*cut(q), bits=8, group_size=GROUP),
                            mx.dequantize(*cut(q), group_size=GROUP, bits=8)).item() for q in (keys, values)]
    result["dequant_rows_exact"] = all(exact)
    print(f"dequant rows equal to MLX's: {all(exact)}", flush=True)


def _span_copy(result: dict, context: int, bits: int) -> None:
    layers = [_Layer(_store(buffer_positions(context + 45), bits), context + 45) for _ in range(LAYERS)]
    mx.eval([layer.parts for layer in layers])
    ms = median_ms(lambda: state.copy_kv_span(layers, context, context + 45), 20, warmup=3)
    row = {"bits": bits, "rows": 45, "ms": round(ms, 3), "arrays": len(state.copy_kv_span(layers, context, context + 45))}
    result.setdefault("span_copy", []).append(row)
    print(f"span copy: {row}", flush=True)
