"""Whether MLX runs on its CUDA backend in this process: the one test `engine.cuda_backend` (which gates our
kernels) and `engine.cuda_kernel_cache` (which `engine.cuda_backend` imports, so cannot ask it) both use."""
from __future__ import annotations

import functools

import mlx.core as mx


@functools.lru_cache(maxsize=None)
def _on_cuda(device: str) -> bool:
    cuda = getattr(mx, "cuda", None)
    try:
        return device.startswith("Device(gpu") and cuda is not None and bool(cuda.is_available()) \
            and hasattr(mx.fast, "cuda_kernel")
    except (RuntimeError, AttributeError):
        return False


def on_cuda() -> bool:
    """Whether MLX's default device is a GPU of its CUDA backend, with `mx.fast.cuda_kernel` there to build ours."""
    return _on_cuda(str(mx.default_device()))
