"""The load-time measurement of "qmm" (`engine.cuda_qmm`) for `engine.decode_choice`.

The first block's quantized linears multiply inputs of `ROWS` rows (a verify forward's size and a question's),
MLX's `quantized_matmul` against ours, `decode_measure.REPEAT` times per evaluation, after each of ours was held to a
float32 product of the dequantized weight (`decode_measure.check_close`). The timing kept is the row count where
ours did worst against MLX's, so ours runs only where it wins at both. Every tile bucket is built here for the
model's shapes, so a question of a new length never compiles in the middle of a request.
"""
from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine import cuda_qmm
from engine.decode_measure import REPEAT, Timings, check_close, compute_dtype
from engine.linear_mode import first_block_linears
from engine.timing import best_seconds

logger = logging.getLogger(__name__)

ROWS = (16, 45)
"""Rows timed: a 16-token verify forward, a 45-token question (run w's)."""


def measure(model: Any) -> Timings:
    """{"qmm": (MLX seconds, ours seconds)} at the row count of `ROWS` where ours did worst, or {} where the
    kernel takes none of the first block's linears or fails its check (or to compile)."""
    linears = first_block_linears(model)
    dtype = compute_dtype(model)
    if not linears or any(cuda_qmm.unsupported(m, dtype) is not None for m in linears):
        return {}
    try:
        for tiles in cuda_qmm.TILE_BUCKETS:  # built now, not at a request's first question of that length
            mx.eval([cuda_qmm.linear_product(m, _rows(m, 8 * tiles, dtype, 0)) for m in linears])
        pairs = [_timed(linears, rows, dtype) for rows in ROWS]
    except Exception as err:  # noqa: BLE001 - an optimization: left out, not fatal
        logger.warning("decode kernels: qmm: %s; not using it", err)
        return {}
    return {"qmm": max(pairs, key=lambda pair: pair[1] / pair[0])}


def _rows(linear: nn.QuantizedLinear, rows: int, dtype: mx.Dtype, seed: int) -> mx.array:
    k = linear["weight"].shape[1] * 32 // linear.bits
    return mx.random.normal((1, rows, k), key=mx.random.key(seed)).astype(dtype)


def _timed(linears: list[nn.QuantizedLinear], rows: int, dtype: mx.Dtype) -> tuple[float, float]:
    xs = [_rows(m, rows, dtype, 70 + i) for i, m in enumerate(linears)]
    for m, x in zip(linears, xs):
        weight = mx.dequantize(m["weight"], m["scales"], m["biases"], m.group_size, m.bits, dtype=mx.float32)
        check_close("qmm", cuda_qmm.linear_product(m, x), x.astype(mx.float32) @ weight.T)
    pairs = list(zip(linears, xs)) * REPEAT
    return (best_seconds(lambda: [nn.QuantizedLinear.__call__(m, x) for m, x in pairs]),
            best_seconds(lambda: [cuda_qmm.linear_product(m, x) for m, x in pairs]))
