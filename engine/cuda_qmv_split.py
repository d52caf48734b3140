"""`engine.cuda_qmv`'s product with each warp's rows split over K (MLX's CUDA backend, decode-sized inputs).

`cuda_qmv` gives one warp `R` output rows and walks each row's whole K. A matrix of few rows and long rows then
has few warps, each with a long walk: on the H200 a 64-layer 4-bit model's down projection (5,120 rows of
25,600) ran at 2.0 TB/s and its o projection (5,120 of 8,192) at 1.7, against 2.9 for the gate and up
projections (25,600 rows: five times the warps), whose kernel is the same (docs/benchmarks.md, *GPU engine*,
twelfth session). Here `SPLIT` warps of a block take the same rows, each a contiguous run of the chunks, and
their sums meet in shared memory, added in a fixed order: `split_k` warps as many, for matrices of few warps.
The loop is `cuda_qmv`'s, unchanged. Chosen by measurement (``qmv_split``, `engine.decode_choice`), against
`cuda_qmv` on the block's linears it splits.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend, cuda_qmv
from engine.cuda_qmv import WARPS, _CONSTANTS, _HEADER, _LOOP, _ROWS

SPLITS = (4, 2)
"""Splits tried, the most first: each must divide `cuda_qmv.WARPS` (a block's warps)."""
RESIDENT_WARPS = 132 * 40
"""Warps the split may bring a product to: as many as the H200's 132 multiprocessors hold at once at this
kernel's registers for one input row (48 compiled for sm_90: five blocks of eight warps; more is a second wave)."""
LEAST_STEPS = 4
"""Chunk steps (32 lanes' chunks) each part keeps at least."""

_WHOLE_WALK = "for (int it = 0; it < ITERS; ++it)"
if _LOOP.count(_WHOLE_WALK) != 1:  # each part must walk its own run, not the whole row
    raise RuntimeError("engine.cuda_qmv's loop header changed: engine.cuda_qmv_split walks parts of it")

_SOURCE = _CONSTANTS + r"""
  // SPLIT warps take one warp's R rows, each a contiguous run of the chunk steps (split evenly); lane 0 of each
  // leaves its sums in shared memory, and the first of them adds them in order and writes the rows.
  static_assert(WARPS % SPLIT == 0, "a row group's warps lie in one block");
  const int part = threadIdx.y % SPLIT;
  const int row0 = (blockIdx.y * blockDim.y + threadIdx.y) / SPLIT * R;
  const bool active = row0 < N;
  const int it_begin = part * ITERS / SPLIT, it_end = (part + 1) * ITERS / SPLIT;
  __shared__ float partial[WARPS][M][R];
  float sums[M][R];
  if (active) {
""" + _ROWS + _LOOP.replace(_WHOLE_WALK, "for (int it = it_begin; it < it_end; ++it)") + r"""
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float v = acc[m][r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        sums[m][r] = v;
      }
  }
  if (active && lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) partial[threadIdx.y][m][r] = sums[m][r];
  }
  __syncthreads();
  if (active && part == 0 && lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float total = 0.f;
#pragma unroll
        for (int s = 0; s < SPLIT; ++s) total += partial[threadIdx.y + s][m][r];
        y[(size_t)m * N + row0 + r] = static_cast<T>(total);
      }
  }
"""


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv_split", _SOURCE, _HEADER, input_names=["x", "w", "scales", "biases"],
                               output_names=["y"])


@functools.lru_cache(maxsize=1)
def _residual_kernel() -> Any:
    return cuda_backend.kernel("codectx_qmv_split_residual", cuda_qmv.with_residual(_SOURCE, "total"), _HEADER,
                               input_names=["x", "w", "scales", "biases", "res"], output_names=["y"])


@functools.lru_cache(maxsize=256)
def split_k(n: int, k: int, bits: int, rows: int = 1) -> int:
    """Warps a product of `n` rows of `k` values splits each warp's rows over: the most of `SPLITS` that keeps the
    warps within `RESIDENT_WARPS` and each part at least `LEAST_STEPS` chunk steps long (the steps split evenly),
    for one input row (decode; more rows hold more registers, hence fewer resident warps); 1: not split. Asked on
    every decode call of a split-able linear: kept per shape."""
    if rows != 1:
        return 1
    warps = n // cuda_qmv.rows_per_warp(n)
    steps = -(-(k * bits // 128) // 32)  # 16-byte chunks a row, 32 a step
    for split in SPLITS:
        if warps * split <= RESIDENT_WARPS and steps >= split * LEAST_STEPS:
            return split
    return 1


def linear_split(linear: Any, rows: int = 1) -> int:
    """`split_k` for a quantized linear's matrix and `rows` input rows."""
    weight = linear["weight"]
    return split_k(weight.shape[0], weight.shape[1] * 32 // linear.bits, linear.bits, rows)


def qmv(x: mx.array, weight: mx.array, scales: mx.array, biases: mx.array, *, bits: int, group_size: int,
        split: int, residual: mx.array | None = None) -> mx.array:
    """`cuda_qmv.qmv` with each warp's rows split over K among `split` warps (`residual` as there)."""
    if WARPS % split:
        raise ValueError(f"a split of {split} does not divide a block's {WARPS} warps")
    return cuda_qmv.launch((_kernel, _residual_kernel), x, weight, scales, biases, bits=bits, group_size=group_size,
                           residual=residual, split=split, template=(("SPLIT", split), ("WARPS", WARPS)))


def linear_product(linear: Any, x: mx.array, residual: mx.array | None = None) -> mx.array:
    """`cuda_qmv.linear_product`, split over K where `split_k` says so."""
    split = linear_split(linear, x.size // x.shape[-1])
    return cuda_qmv.linear_product(linear, x, residual, None if split == 1 else functools.partial(qmv, split=split))
