"""Quantize weights to MLX's affine format, keeping values that already lie on a grid exact.

MLX's affine format stores each group of `group` values as unsigned `bits`-bit
integers q with a float16 scale and bias: value = scale * q + bias. llama.cpp's
4-bit types (Q4_0, Q4_1, Q4_K) and Q8_0, Q5_K at 8 bits, are exactly that per
32 values once dequantized: a group's values are `bias + step * k` for
integers k within the range. Requantizing such a group from its own
minimum and maximum (what `mx.quantize` does) puts a new grid over the old one
and adds a second rounding error (up to a whole level of the old grid:
tests/engine/test_affine_quant.py); on the default model (Q4_1) it cost a
next-token KL of 0.32 at 4 bits (one throwaway run at commit dc43f59, which
used `mx.quantize`, over 3,000 characters of a source file). Here a group whose values sit on a grid of at
most 2**bits levels keeps that grid (exact up to float16 scales); any other
group gets the usual scale (max - min) / (2**bits - 1).
"""
from __future__ import annotations

import numpy as np

_ROWS_PER_CHUNK = 2048  # bounds the temporaries of one large matrix (an embedding)
_ON_GRID = 1e-3  # how far from an integer a value's level may be (float32 dequantization noise)
_MAX_PARTS = 6  # fractions of the smallest gap tried as the grid's step


def quantize_affine(values: np.ndarray, bits: int, group: int, *,
                    find_grids: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize a matrix row-wise in groups, packed as `mx.quantize` packs.

    Args:
        values: (rows, columns) float32; columns a multiple of `group`.
        bits: 4 or 8.
        group: Values per scale/bias pair.
        find_grids: Look for groups already on a grid (False for values that were floats).

    Returns:
        (weight uint32 (rows, columns * bits / 32), scales float16 (rows, columns / group),
        biases float16 (rows, columns / group)), for `mx.dequantize(..., group, bits)`.
    """
    if bits not in (4, 8) or values.ndim != 2 or values.shape[1] % group:
        raise ValueError(f"cannot quantize shape {values.shape} to {bits} bits in groups of {group}")
    parts = [_chunk(values[start:start + _ROWS_PER_CHUNK], bits, group, find_grids)
             for start in range(0, values.shape[0], _ROWS_PER_CHUNK)]
    return tuple(np.concatenate(column) for column in zip(*parts))  # type: ignore[return-value]


def _chunk(values: np.ndarray, bits: int, group: int, find_grids: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, columns = values.shape
    groups = values.astype(np.float32, copy=False).reshape(-1, group)
    top = (1 << bits) - 1
    low, high = groups.min(axis=1), groups.max(axis=1)
    scale = (high - low) / top
    if find_grids:
        step = _grid_step(groups, low, high, top)
        scale = np.where(np.isfinite(step), step, scale)
    # the float16 scale and bias are what dequantization will use: quantize against them
    scale16, bias16 = scale.astype(np.float16), low.astype(np.float16)
    safe = np.where(scale16 > 0, scale16.astype(np.float32), 1.0)
    levels = np.rint((groups - bias16.astype(np.float32)[:, None]) / safe[:, None])
    q = np.clip(levels, 0, top).astype(np.uint32)
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, :]
    packed = np.bitwise_or.reduce(q.reshape(-1, per_word) << shifts, axis=1).astype(np.uint32)
    return (packed.reshape(rows, columns * bits // 32), scale16.reshape(rows, -1), bias16.reshape(rows, -1))


def _grid_step(groups: np.ndarray, low: np.ndarray, high: np.ndarray, top: int) -> np.ndarray:
    """Per group, the step of the grid its values lie on, or inf where they lie on none that fits.

    The step divides the smallest gap between distinct values: 32 values of an 8-bit
    grid seldom sit on neighbouring levels, so whole fractions of that gap are tried too.
    """
    ordered = np.sort(groups, axis=1)
    gaps = np.diff(ordered, axis=1)
    tiny = np.maximum(np.abs(low), np.abs(high))[:, None] * 1e-6
    smallest = np.where(gaps > tiny, gaps, np.inf).min(axis=1)
    found = np.full(groups.shape[0], np.inf, dtype=np.float32)
    for parts in range(1, _MAX_PARTS + 1):
        open_ = ~np.isfinite(found) & np.isfinite(smallest)
        if not open_.any():
            break
        every = open_.all()  # the first pass usually: no gather
        rows = groups if every else groups[open_]
        span = (high - low) if every else high[open_] - low[open_]
        # the whole span, a whole number of steps, pins the step far better than one gap
        step = span / np.maximum(np.rint(span / ((smallest if every else smallest[open_]) / parts)), 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            levels = (rows - (low if every else low[open_])[:, None]) / step[:, None]
            rounded = np.rint(levels)
            fits = rounded.max(axis=1) <= top
            np.subtract(levels, rounded, out=levels)
            fits &= np.abs(levels, out=levels).max(axis=1) < _ON_GRID
        found[np.flatnonzero(open_)[fits]] = step[fits]
    return found
