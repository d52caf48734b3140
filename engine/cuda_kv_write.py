"""A decode step's 8-bit cache write in place on MLX's CUDA backend: one kernel per layer, no copy.

MLX writes a row into a cache buffer with ``buffer[..., start:end, :] = row`` (a slice update),
in place only when nothing else holds the buffer's memory at the time the update is encoded.
A decode step is queued while the previous one still runs (`engine.generate.decode`), and the
previous step's kernels hold the buffers until they finish; then the update copies the whole
buffer (at 131,072 tokens 134 MB per 8-bit tensor and layer) and frees the old one, every step.
Measured on the H200 (docs/benchmarks.md, *GPU engine*, seventh session): a one-row write
followed by a reader took 80 µs (read through a view) and 87 µs (read by our kernel) per step over
a 131,072-row buffer, with three buffers' worth of memory in flight (run o); a Qwen3-32B-shaped
8-bit decode step at 131k took 38.5 ms in a process that had run bf16 steps before (23.8 ms in a
fresh one) and 23.1 ms with this kernel's first version (run p, printed only); where a process
did not fall into the copies, the kernel gained nothing (24.7 ms with MLX's write, 25.4 with ours,
run q). An 8-bit write is also eight operations per layer (two `mx.quantize`, six slice updates);
this is one.

The kernel writes the row where it lies (the buffers are its inputs: MLX does not know they
changed). Two rules keep that correct:

- *Ordering.* MLX's CUDA backend records a step's kernels in CUDA graphs whose edges come from
  the buffers each kernel declares it reads and writes; a reader of these buffers is therefore not
  ordered after this write unless it takes the write's output as an input. A row is written in
  place only where its one reader in the step is our decode attention (`engine.cuda_attention`,
  given the output as ``after``: `engine.decode_kernels.Q8Rows`): the cache asks for it on that
  fetch alone (`engine.window.WindowKVCache.update_and_fetch`), and the compute path turns it on
  only together with that kernel (`engine.decode_choice`). The store's arrays are then made to
  depend on the output (`mx.depends`), so anything evaluated later evaluates the write first, and
  later evaluations run after it on the stream (which also orders a write after a rollback behind
  the reads of the rows it overwrites).
- *Ownership.* The store writes in place only into buffers its own slice updates made, which
  nothing else holds (`engine.qkv.QuantizedKVStore._in_place`); those are row-contiguous, as the
  kernel assumes for the packed bytes.

The row is quantized as MLX's affine quantization does (groups of `group_size`, per group
``scale = (max - min) / 255`` with the larger-magnitude edge kept exact, scales and biases stored
in the rows' dtype); the load-time check (`engine.decode_choice`) holds it to `mx.quantize`'s
values within one quantization step.
"""
from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from engine import cuda_backend

_Q8 = r"""
  // One warp per (which, head): E = D / 32 consecutive elements per lane, groups of GS elements
  // (GS / E lanes each), quantized as MLX's affine quantization does.
  constexpr int E = D / 32, L = GS / E;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  const int H = kn_shape[1];
  if (warp == 0 && lane == 0) done[0] = 0;
  if (warp >= 2 * H) return;
  const int which = warp / H, h = warp % H;
  const int64_t row = meta[0];
  const T* src = which ? vn + h * vn_strides[1] : kn + h * kn_strides[1];
  const auto step = which ? vn_strides[3] : kn_strides[3];
  float w[E];
  float lo = 3.402823466e38f, hi = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    w[e] = static_cast<float>(src[(lane * E + e) * step]);
    lo = fminf(lo, w[e]);
    hi = fmaxf(hi, w[e]);
  }
#pragma unroll
  for (int m = 1; m < L; m <<= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xFFFFFFFFu, lo, m));
    hi = fmaxf(hi, __shfl_xor_sync(0xFFFFFFFFu, hi, m));
  }
  float scale = fmaxf((hi - lo) / 255.f, 1e-7f);
  const bool low_edge = fabsf(lo) > fabsf(hi);
  scale = low_edge ? scale : -scale;
  const float edge = low_edge ? lo : hi;
  const float q0 = roundf(edge / scale);
  const bool at_zero = q0 == 0.f;
  scale = at_zero ? scale : edge / q0;
  const float bias = at_zero ? 0.f : edge;

  uint8_t* bytes = reinterpret_cast<uint8_t*>(const_cast<uint32_t*>(
      which ? vq + h * vq_strides[1] + row * vq_strides[2] : kq + h * kq_strides[1] + row * kq_strides[2]));
#pragma unroll
  for (int e = 0; e < E; ++e) {
    bytes[lane * E + e] = static_cast<uint8_t>(fminf(fmaxf(roundf((w[e] - bias) / scale), 0.f), 255.f));
  }
  if (lane % L == 0) {
    const int g = lane / L;
    T* scales = const_cast<T*>(which ? vs + h * vs_strides[1] + row * vs_strides[2]
                                     : ks + h * ks_strides[1] + row * ks_strides[2]);
    T* biases = const_cast<T*>(which ? vb + h * vb_strides[1] + row * vb_strides[2]
                                     : kb + h * kb_strides[1] + row * kb_strides[2]);
    scales[g * (which ? vs_strides[3] : ks_strides[3])] = static_cast<T>(scale);
    biases[g * (which ? vb_strides[3] : kb_strides[3])] = static_cast<T>(bias);
  }
"""


@functools.lru_cache(maxsize=1)
def _q8_kernel() -> Any:
    return cuda_backend.kernel("codectx_kv_write_q8", _Q8,
                               input_names=["kq", "ks", "kb", "vq", "vs", "vb", "kn", "vn", "meta"],
                               output_names=["done"], ensure_row_contiguous=False)


def shape_problem(keys: mx.array, bits: int, group_size: int = 64) -> str | None:
    """Why the new rows `keys` (1, heads, 1, D) cannot be written by this kernel (None: they can)."""
    if not cuda_backend.cuda_available():
        return "not MLX's CUDA backend"
    B, _, n, D = keys.shape
    if B != 1 or n != 1:
        return f"{B} x {n} rows"
    if bits != 8:
        return f"{bits}-bit cache"
    if keys.dtype not in (mx.bfloat16, mx.float16, mx.float32):
        return f"{keys.dtype} rows"
    if D % 32 or group_size % (D // 32) or D % group_size:
        return f"head dim {D}, group {group_size}"
    return None


def write_q8(kbufs: tuple[mx.array, ...], vbufs: tuple[mx.array, ...], keys: mx.array, values: mx.array,
             start: int | mx.array, group_size: int) -> mx.array:
    """Quantize one row of keys/values (1, H, 1, D) to 8 bits and write it at `start` (an int, or an int32
    array of one element: a traced step's position, `engine.compiled`) into an 8-bit store's
    (packed, scales, biases) buffers, in place. Returns what readers must depend on."""
    H, D = keys.shape[1], keys.shape[3]
    threads = 2 * H * 32
    return _q8_kernel()(inputs=[*kbufs, *vbufs, keys, values, cuda_backend.sizes(start)],
                        template=[("T", kbufs[1].dtype), ("D", D), ("GS", group_size)],
                        grid=(-(-threads // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
                        output_shapes=[(1,)], output_dtypes=[mx.int32])[0]


def write_q8_ordered(kbufs: tuple[mx.array, ...], vbufs: tuple[mx.array, ...], keys: mx.array, values: mx.array,
                     start: int | mx.array, group_size: int) -> tuple[tuple, tuple, mx.array]:
    """`write_q8`, and the buffers as arrays that depend on it (whatever reads them through these is
    ordered after the write): (keys' buffers, values' buffers, the write's output)."""
    done = write_q8(kbufs, vbufs, keys, values, start, group_size)
    arrays = mx.depends([*kbufs, *vbufs], [done])
    return tuple(arrays[:3]), tuple(arrays[3:]), done
