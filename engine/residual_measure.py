"""The load-time measurement of ``residual_fused`` (`engine.fused_residual`): a block's residual adds in its o and
down projections' launches, checked and timed on the model's first block, beside our linears (`engine.decode_choice`
calls it once ``qmv`` was measured)."""
from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine import compiled_mlp, cuda_qmv, cuda_qmv_split, decode_kernels, fused_residual, linear_mode
from engine.decode_measure import REPEAT, Timings, check_close, compute_dtype
from engine.timing import best_seconds

logger = logging.getLogger(__name__)


def measure(model: Any) -> Timings:
    """"residual_fused": the first block's o and down projections on one row, `REPEAT` each per evaluation, our
    kernel then MLX's add against the add in the launch. Checked first: each product with the residual against our
    kernel's plus MLX's add (the split kernel's too, where it splits the projection), then the block's own call on
    one row with its residuals in the launches against the same call with MLX's adds (`check_block`). Left out where
    no block takes the call or a check fails (or the kernel does not compile)."""
    found = fused_residual.blocks(model)
    dtype = compute_dtype(model)
    if not found:
        return {}
    linears = (found[0].self_attn.o_proj, found[0].mlp.down_proj)
    if not all(cuda_qmv.takes(m, dtype) for m in linears):
        return {}
    rows = [(m, *(mx.random.normal((1, 1, n), key=mx.random.key(70 + 2 * i + j)).astype(dtype)
                  for j, n in enumerate((m.weight.shape[1] * 32 // m.bits, m.weight.shape[0]))))
            for i, m in enumerate(linears)]
    try:
        for m, x, r in rows:
            kernels = (cuda_qmv, cuda_qmv_split) if cuda_qmv_split.linear_split(m) > 1 else (cuda_qmv,)
            for kernel in kernels:
                check_close("residual_fused", kernel.linear_product(m, x, r), r + kernel.linear_product(m, x))
        check_block(found[0], dtype)
        return {"residual_fused": (
            best_seconds(lambda: [r + cuda_qmv.linear_product(m, x) for _ in range(REPEAT) for m, x, r in rows]),
            best_seconds(lambda: [cuda_qmv.linear_product(m, x, r) for _ in range(REPEAT) for m, x, r in rows]))}
    except Exception as err:  # noqa: BLE001 - the newest kernel: left out, not fatal
        logger.warning("decode kernels: residual adds in the projections: %s; not using them", err)
        return {}


def check_block(block: Any, dtype: mx.Dtype) -> None:
    """Raises RuntimeError unless `block`'s call on one random row (no cache) through our linears gives the same
    with its residuals offered to its projections as with MLX's adds: the wiring held to the block's own call (each
    residual added once). The block has `fused_residual.ResidualCall` for the check and its own class back after
    (the compute path wires the blocks if the kernel is chosen)."""
    own = type(block)
    compiled_mlp.mix_in(block, fused_residual.ResidualCall)
    x = mx.random.normal((1, 1, block.self_attn.o_proj.weight.shape[0]), key=mx.random.key(80)).astype(dtype)
    linears = [m for m in block.modules() if isinstance(m, nn.QuantizedLinear)]
    try:
        with linear_mode.wired(linears):
            with decode_kernels.scope(qmv=True, attention=False):
                plain = block(x)
            with decode_kernels.scope(qmv=True, attention=False, residual=True):
                fused = block(x)
    finally:
        block.__class__ = own
    check_close("residual_fused", fused, plain, "block")
