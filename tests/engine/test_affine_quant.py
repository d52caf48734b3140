"""The affine quantizer GGUF conversion uses: MLX's packing, grids kept exact, other groups as usual."""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from engine.affine_quant import quantize_affine


def _back(parts: tuple[np.ndarray, np.ndarray, np.ndarray], bits: int) -> np.ndarray:
    weight, scales, biases = (mx.array(p) for p in parts)
    return np.array(mx.dequantize(weight, scales, biases, group_size=32, bits=bits).astype(mx.float32))


def _grid(rows: int, columns: int, levels: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Values `low + step * k` per group of 32 (what a dequantized Q4_K/Q4_1/Q8_0 block holds)."""
    rng = np.random.default_rng(seed)
    groups = rows * columns // 32
    step = rng.uniform(1e-3, 5e-2, (groups, 1)).astype(np.float32)
    low = rng.normal(0, 0.1, (groups, 1)).astype(np.float32)
    k = rng.integers(0, levels, (groups, 32))
    return (low + step * k).astype(np.float32).reshape(rows, columns), step


# float16 scale and bias: a relative 2**-11 each; the scale's times up to 255 levels (8 bits) or 15 (4),
# the bias's times |low| / step (up to ~300 here): at most ~0.125 + ~0.15 of a level
@pytest.mark.parametrize("bits,levels,tolerance", [(4, 16, 0.1), (8, 256, 0.35), (8, 16, 0.1)])
def test_values_on_a_grid_that_fits_come_back_exactly_up_to_float16_scales(bits, levels, tolerance):
    values, step = _grid(64, 256, levels, seed=bits + levels)
    back = _back(quantize_affine(values, bits, 32), bits)
    assert (np.abs(back - values).reshape(-1, 32) / step).max() < tolerance  # in levels of the source grid
    mlx_back = np.array(mx.dequantize(*mx.quantize(mx.array(values).astype(mx.float16), group_size=32, bits=bits),
                                      group_size=32, bits=bits).astype(mx.float32))
    if levels == 1 << bits:  # a fresh min/max grid over the old one misses by up to half a level and more
        assert (np.abs(mlx_back - values).reshape(-1, 32) / step).max() > 0.4


@pytest.mark.parametrize("bits", [4, 8])
def test_other_values_get_the_usual_min_max_grid(bits):
    values = np.random.default_rng(bits).normal(0, 1, (48, 128)).astype(np.float32)
    weight, scales, biases = quantize_affine(values, bits, 32)
    assert weight.dtype == np.uint32 and weight.shape == (48, 128 * bits // 32)
    assert scales.shape == biases.shape == (48, 4) and scales.dtype == np.float16
    groups = values.reshape(-1, 32)
    span = (groups.max(1) - groups.min(1)) / ((1 << bits) - 1)
    error = np.abs(_back((weight, scales, biases), bits) - values).reshape(-1, 32).max(1)
    assert np.all(error <= span * 0.5 + np.abs(groups).max(1) * 2e-3)  # half a level + float16 rounding


def test_constant_groups_and_bad_shapes():
    values = np.full((2, 64), 0.25, dtype=np.float32)
    assert np.array_equal(_back(quantize_affine(values, 4, 32), 4), values)
    with pytest.raises(ValueError, match="groups of 32"):
        quantize_affine(np.zeros((2, 48), dtype=np.float32), 4, 32)
