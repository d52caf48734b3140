"""The few-row tensor-core product of `bench/qmm_kernel.py` (an experiment, not in the engine) on a machine without
a GPU: how it cuts the work, its build for the H200, and its lane layout transliterated to NumPy.

The kernel itself runs only on MLX's CUDA backend (`bench/gpu_qmm.py` times it and checks it against a float32
product there). Here `model_product` follows the kernel's index arithmetic lane by lane (which packed words a lane
reads for a chunk and which of them at a step, which scale, how the four values fill the A fragment, which input
values fill B, where each accumulator lands) and multiplies the fragments as PTX's ``mma.m16n8k16`` defines them;
on MLX's own packing of a random weight it must give the product of the dequantized weight.
"""
from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from bench import qmm_kernel
from tests.engine.cuda_compile import compile_errors, recorded, resources

SHAPES = ((8192, 5120), (1024, 5120), (5120, 8192), (25600, 5120), (5120, 25600))  # Qwen3-32B's linears (N, K)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("tile_count", qmm_kernel.TILE_BUCKETS)
def test_splits_keep_every_warp_busy_and_the_partial_sums_small(bits, tile_count):
    for n, k in SHAPES:
        parts = qmm_kernel.splits(n, k, bits, tile_count)
        chunks = k // 64
        assert chunks % parts == 0
        assert parts == 1 or parts * 8 * tile_count * n * 4 <= n * k * bits // 8 // 2  # partials: half the weight
        warps = n // (16 * qmm_kernel.rows_per_warp(n, tile_count)) * parts
        fewer = [s for s in range(1, parts) if chunks % s == 0]
        assert warps >= qmm_kernel.TARGET_WARPS or parts == max(
            s for s in range(1, chunks + 1) if chunks % s == 0 and s * 8 * tile_count * n * 4 <= n * k * bits // 16)
        assert all(n // (16 * qmm_kernel.rows_per_warp(n, tile_count)) * s < qmm_kernel.TARGET_WARPS for s in fewer)


def test_a_row_count_takes_the_smallest_bucket_that_holds_it():
    assert [qmm_kernel.tiles(r) for r in (9, 16, 17, 45, 48, 49, 64)] == [2, 2, 4, 6, 6, 8, 8]
    with pytest.raises(ValueError, match="at most 64"):
        qmm_kernel.tiles(65)


def _positions(s: int, bits: int) -> list[int]:
    """Which of a lane's 16 values of a chunk fill columns 2t, 2t+1, 2t+8, 2t+9 at step s: for 4 bits values
    (j, j + 4) then (j + 1, j + 5) of word s >> 1, j = 2 (s & 1) (the nibble pairs); for 8 bits 4s .. 4s + 3."""
    if bits == 4:
        base, j = 8 * (s >> 1), 2 * (s & 1)
        return [base + j, base + j + 4, base + j + 1, base + j + 5]
    return [4 * s + i for i in range(4)]


def _four(words: np.ndarray, s: int, bits: int) -> list[int]:
    """The lane's four values at step s from its packed words of a row's chunk (`_positions`' order)."""
    per_word = 32 // bits
    return [(int(words[p // per_word]) >> (bits * (p % per_word))) & ((1 << bits) - 1) for p in _positions(s, bits)]


def model_product(x: np.ndarray, w: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, gs: int,
                  r_sets: int) -> np.ndarray:
    """The kernel's lanes for every block and chunk, in float64 (order of sums aside)."""
    rows, k = x.shape
    n = w.shape[0]
    vpw = 32 // bits
    wpc = 64 // vpw
    tile_count = -(-rows // 8)
    xp = np.zeros((8 * tile_count, k)); xp[:rows] = x
    flat_w = w.reshape(-1)
    y = np.zeros((8 * tile_count, n))
    for row0 in range(0, n, 16 * r_sets):
        for c in range(k // 64):
            for s in range(4):
                for r in range(r_sets):
                    a = np.zeros((16, 16))  # this step's A: 16 weight rows x 16 columns of k
                    b = np.zeros((16, 8 * tile_count))  # its B: 16 columns of k x every input row
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        base = (row0 + g) * (k // vpw) + (16 // vpw) * t  # the lane's words of a row's chunk
                        for h in range(2):
                            words = flat_w[base + (16 * r + 8 * h) * (k // vpw) + c * wpc:][:16 // vpw]
                            row = row0 + g + 16 * r + 8 * h
                            gi = (c * 64 + 16 * t) // gs
                            v = [q * scales[row, gi] + biases[row, gi] for q in _four(words, s, bits)]
                            # a0/a1: rows g, g + 8 at columns 2t, 2t+1; a2/a3: at columns 2t+8, 2t+9
                            a[g + 8 * h, [2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9]] = v
                        for j in range(tile_count):  # b0, b1: the same four of the input's 16 values from 16t
                            values = xp[8 * j + g, c * 64 + 16 * t:c * 64 + 16 * t + 16]
                            b[[2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9], 8 * j + g] = values[_positions(s, bits)]
                    d = a @ b  # (16 weight rows, input rows): lane (g, t) holds rows g, g + 8 at columns 2t, 2t+1
                    y[:, row0 + 16 * r:row0 + 16 * r + 16] += d.T
    return y[:rows]


@pytest.mark.parametrize("bits,gs", [(4, 64), (4, 32), (4, 128), (8, 64)])
def test_the_lane_layout_computes_the_dequantized_product(bits, gs):
    n, k, rows = 64, 256, 13
    weight = mx.random.normal((n, k), key=mx.random.key(1))
    w, scales, biases = mx.quantize(weight, group_size=gs, bits=bits)
    x = np.array(mx.random.normal((rows, k), key=mx.random.key(2)), dtype=np.float64)
    dense = np.array(mx.dequantize(w, scales, biases, group_size=gs, bits=bits), dtype=np.float64)
    got = model_product(x, np.array(w), np.array(scales, dtype=np.float64), np.array(biases, dtype=np.float64), bits,
                        gs, qmm_kernel.rows_per_warp(n, qmm_kernel.tiles(rows)))
    # (MLX dequantizes in float32, the model in float64: 1e-6 apart; a misplaced value is off by the values' size)
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=1e-4)
    assert np.abs(x @ dense.T).mean() > 1.0


@pytest.fixture
def recorder(monkeypatch):
    yield from recorded(monkeypatch, (qmm_kernel._kernel, qmm_kernel._problem))


def test_every_bucket_compiles_for_the_h200_without_spilling(recorder):
    """Each tile bucket, width and dtype the experiment runs (MLX's kernel call recorded by a stand-in: MLX's CUDA
    backend does not run here), compiled by NVRTC for sm_90: no error, no register spilled to local memory."""
    for bits, group_size in ((4, 64), (4, 128), (8, 64)):
        for dtype, rows, (n, k) in ((mx.bfloat16, 45, (1024, 5120)), (mx.bfloat16, 64, (5120, 25600)),
                                    (mx.float16, 9, (25600, 5120)), (mx.bfloat16, 30, (8192, 5120))):
            weight = mx.zeros((n, k * bits // 32), dtype=mx.uint32)
            scales = mx.zeros((n, k // group_size), dtype=dtype)
            out = qmm_kernel.qmm(mx.zeros((1, rows, k), dtype=dtype), weight, scales, scales, bits=bits,
                                 group_size=group_size)
            assert out.shape == (1, rows, n) and out.dtype == dtype
    sources = recorder.sources()
    assert len(sources) >= 12
    for label, source in sources.items():
        assert compile_errors(source) is None, label
        used = resources(source)
        assert used["registers"] <= 255 and used["stack"] == 0, (label, used)
        assert used["spill_stores"] == used["spill_loads"] == 0, (label, used)
