"""`ComputeOptions`: how an engine may compute its model's forward (no MLX here).

The options are settings (``compute.*``, docs/configuration.md) and arguments of
`engine.engine.Engine`; `engine.compute.choose` turns them, with the model, into
the one `ComputePath` an engine runs, and that resolved path (not the request)
is part of the checkpoint policy fingerprint. Start-up code builds them before
MLX is imported, since ``blas`` and ``blas_threads`` are what
`engine.blas.preload` needs.
"""
from __future__ import annotations

from dataclasses import dataclass

ATTENTION_CHOICES = ("auto", "mlx", "numpy")
FORWARD_CHOICES = ("auto", "mlx", "numpy")
LINEAR_CHOICES = ("auto", "quantized", "dequantized")
KERNEL_CHOICES = ("auto", "mlx", "codectx")
ROOM_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class ComputeOptions:
    """What the engine may use to compute a forward pass.

    Args:
        attention: "auto" (NumPy attention on the CPU for llama/qwen-style
            attention, else MLX), "mlx" (the model's own MLX attention) or
            "numpy" (NumPy attention wherever the model's attention is
            llama/qwen-style, on any device).
        forward: "auto" (the whole layer in NumPy where `engine.cpu_forward`
            supports the model and attention is NumPy's), "mlx" (the model's
            own layers) or "numpy" (as auto, asked for explicitly; with
            attention "mlx" it resolves to "mlx", with a warning).
        compile: Use the compiled one-token decode step and the compiled
            speculative verify step (`engine.compiled`) where MLX runs the layers.
        blas: The BLAS MLX's CPU matmuls use, chosen once per process at
            start-up (`engine.blas.preload`): "auto", "off" or a library path.
        blas_threads: BLAS threads (MLX's, set at start-up, and NumPy's while
            NumPy runs the layers); 0 uses the usable cores, at most 8 (for
            NumPy: the count start-up gave MLX's BLAS).
        linear: How quantized linear layers multiply prefill-sized inputs
            (`engine.linear_mode`): "auto" (measured once per device and model
            shape), "quantized" (the quantized kernel always) or "dequantized"
            (weights dequantized per call from 32 rows on). Decode-sized inputs
            keep the quantized kernel; a model without quantized layers (the
            CPU build's float32) has nothing to choose.
        kernels: Our decode kernels on MLX's CUDA backend (`engine.decode_choice`):
            "auto" (each measured against MLX's once per device and model shape),
            "mlx" (MLX's kernels only) or "codectx" (ours wherever they apply).
            Nothing to choose on other backends.
        room: Positions of room a window cache's buffers keep past the rows a request writes
            (`engine.qkv.Room`), so that its writes do not grow the history: "auto" (`engine.qkv.ROOM_AHEAD`,
            none where MLX's attention runs in the traced decode step over window caches, which attends over
            the whole buffers, room included), "on" (`ROOM_AHEAD` on every path) or "off" (none: a write
            past the buffers grows them by the store's 256 positions).

    Raises:
        ValueError: For a value outside the choices or a negative thread count.
    """

    attention: str = "auto"
    forward: str = "auto"
    compile: bool = True
    blas: str = "auto"
    blas_threads: int = 0
    linear: str = "auto"
    kernels: str = "auto"
    room: str = "auto"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got {self.attention!r}")
        if self.forward not in FORWARD_CHOICES:
            raise ValueError(f"forward must be one of {FORWARD_CHOICES}, got {self.forward!r}")
        if self.linear not in LINEAR_CHOICES:
            raise ValueError(f"linear must be one of {LINEAR_CHOICES}, got {self.linear!r}")
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {self.kernels!r}")
        if self.room not in ROOM_CHOICES:
            raise ValueError(f"room must be one of {ROOM_CHOICES}, got {self.room!r}")
        if not isinstance(self.blas_threads, int) or self.blas_threads < 0:
            raise ValueError(f"blas_threads must be an integer >= 0, got {self.blas_threads!r}")
        if not self.blas:
            raise ValueError("blas must be 'auto', 'off' or a library path")
