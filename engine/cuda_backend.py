"""MLX's CUDA backend: whether it runs here, and device code our kernels share.

Our kernels (`engine.cuda_qmv`, `engine.cuda_attention`) are compiled by MLX at first use
through `mx.fast.cuda_kernel`; they exist only where MLX runs on CUDA.
"""
from __future__ import annotations

import functools

import mlx.core as mx

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


@functools.lru_cache(maxsize=None)
def _cuda_backend(device: str) -> bool:
    cuda = getattr(mx, "cuda", None)
    try:
        return device.startswith("Device(gpu") and cuda is not None and bool(cuda.is_available()) \
            and hasattr(mx.fast, "cuda_kernel")
    except (RuntimeError, AttributeError):
        return False


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
    return _cuda_backend(str(mx.default_device()))
