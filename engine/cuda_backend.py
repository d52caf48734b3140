"""MLX's CUDA backend: whether it runs here, and device code our kernels share.

Our kernels (`engine.cuda_qmv`, `engine.cuda_dequant`, `engine.cuda_attention`,
`engine.cuda_attention_mma`, `engine.cuda_chunk_attention`, `engine.cuda_kv_write`) are compiled by MLX at first use
through `kernel` (`mx.fast.cuda_kernel`); they exist only where MLX runs on CUDA. MLX keeps what it compiles for
them in memory only; `engine.cuda_kernel_cache` writes it where MLX's next process finds it.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx

from engine import cuda_kernel_cache, mlx_cuda

LOG2E = math.log2(math.e)
"""Our attention kernels work in base 2 (`exp2f`): the softmax scale is multiplied by this."""

PRMT_HEADER = r"""
namespace codectx {
// Byte permute: the bytes of b:a picked by the four nibbles of sel (PTX prmt.b32).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
// The byte `b` (0..3) of `w` as an exact float: placed in the mantissa of 2^23, then 2^23 taken off.
__device__ __forceinline__ float byte_f(uint32_t w, uint32_t b) {
  return __uint_as_float(prmt(w, 0x4B000000u, 0x7650u | b)) - 8388608.f;
}
}  // namespace codectx
"""


def affine_problem(mode: str, bits: int, dtype: mx.Dtype, has_biases: bool) -> str | None:
    """Why our 4/8-bit affine kernels (`engine.cuda_qmv`, `engine.cuda_dequant`) cannot take a weight
    (None: they can, as far as these checks go; each kernel adds its own group-size rule)."""
    if not cuda_available():
        return "not MLX's CUDA backend"
    if mode != "affine":
        return f"mode {mode}"
    if not has_biases:
        return "no biases"
    if bits not in (4, 8):
        return f"{bits}-bit weights"
    if dtype not in (mx.bfloat16, mx.float16):
        return f"{dtype} activations"
    return None


def cuda_available() -> bool:
    """Whether MLX runs on its CUDA backend here (the default device is a CUDA GPU)."""
    return mlx_cuda.on_cuda()


def _hash_kernel_modules() -> str:
    here = Path(__file__).parent
    digest = hashlib.sha1()
    try:
        names = ("decode_kernels", "decode_choice", "decode_measure", "compiled_mlp", "compiled", "trace_caches",
                 "step_measure", "fused_linears", "fused_residual", "residual_measure", "linear_mode", "chunk_measure",
                 "cpu_attention")
        for path in [*sorted(here.glob("cuda_*.py")), *(here / f"{name}.py" for name in names)]:
            digest.update(path.read_bytes())
    except OSError:  # no sources to hash (an install without them): nothing cached can be trusted
        return f"unhashed-{os.getpid()}-{id(digest):x}"
    return digest.hexdigest()[:12]


_CODE_VERSION = _hash_kernel_modules()  # at import: the code this process runs, not the files as they are later


def code_version() -> str:
    """A hash of our CUDA kernels' modules (their device code and the Python that calls it), taken when this
    module was imported: what `engine.decode_choice` measured and checked under one version is measured and
    checked again under another, so a changed call is never run unchecked from a cached verdict."""
    return _CODE_VERSION


def kept_verdict(owner: Any, name: str, dtype: mx.Dtype, ask: Callable[[], bool]) -> bool:
    """`ask()` for `owner` (a module) and activations of `dtype`, asked on every decode-sized call (once per layer
    per step) but answered once: kept on the instance as its own attribute `name`, outside the module's
    parameters, for the last dtype and backend asked (a module's shapes and bits do not change)."""
    key = (dtype, cuda_available())
    known = owner.__dict__.get(name)
    if known is None or known[0] != key:
        known = owner.__dict__[name] = (key, ask())
    return known[1]


def kernel(name: str, source: str, header: str = "", **options: Any) -> Any:
    """`mx.fast.cuda_kernel` under `name` plus a hash of its source and signature: some MLX builds
    cache compiled kernels on disk by name alone, so a changed source, or a changed list of inputs
    or outputs (MLX writes the signature from them), must get a new name. Where
    `engine.cuda_kernel_cache` is on, each launch's compiled code is kept on disk for later processes."""
    signature = repr((options.get("input_names"), options.get("output_names")))
    digest = hashlib.sha1((header + source + signature).encode()).hexdigest()[:10]
    made = mx.fast.cuda_kernel(name=f"{name}_{digest}", source=source, header=header, **options)
    return cuda_kernel_cache.wrap(made, f"{name}_{digest}", source, header, options.get("input_names", ()),
                                  options.get("output_names", ()))


@functools.lru_cache(maxsize=16)
def base2_scale(scale: float) -> mx.array:
    """`scale` in base 2 as the one-element float32 array our attention kernels read: made once per
    scale (one per model), not for every layer of every step."""
    return mx.array([scale * LOG2E], dtype=mx.float32)


@functools.lru_cache(maxsize=16)
def int32s(*values: int) -> mx.array:
    """`values` as the small int32 array our kernels read their sizes from (a key count, a split, a row):
    made once for the layers of a step or forward that share them, not once per layer (each array from
    the host is an operation of its own: docs/benchmarks.md, *GPU engine*, seventh session, run n)."""
    return mx.array(values, dtype=mx.int32)


def split_span(n: int | mx.array, rows: int) -> int:
    """The keys a split-key kernel divides among its splits: the count `n`, or for a count given as an array
    (a traced step's, replayed until the buffers grow) the buffers' `rows` (splits past the count are empty
    and weigh nothing in the merge)."""
    return rows if isinstance(n, mx.array) else n


def sizes(n: int | mx.array, *more: int) -> mx.array:
    """A key count and further sizes (keys per split, ...) as our attention kernels read them (int32); `n`
    may be an int32 array of one element (a traced step's count, `engine.compiled`).

    The further sizes are `int32s`' array, the same object in every layer: a traced step's layers then ask for
    one and the same concatenation, which the trace's common-subexpression pass keeps once. (With a new array
    per layer a 64-layer step made 64 concatenations, 128 copy kernels: docs/benchmarks.md, *Fourteenth
    session*.)"""
    if isinstance(n, mx.array):
        count = n.reshape(1).astype(mx.int32)
        return mx.concatenate([count, int32s(*more)]) if more else count
    return int32s(n, *more)


def split_size(n: int, parts: int, target: int, least: int, multiple: int) -> int:
    """Keys per split of a split-key kernel: about `target` splits over `parts` (KV heads, or KV heads
    x row blocks), a multiple of `multiple` (the kernel's tile), at least `least`."""
    per_part = max(1, target // max(1, parts))
    size = -(-n // per_part)
    return max(least, -(-size // multiple) * multiple)
