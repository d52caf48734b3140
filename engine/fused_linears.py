"""A decode step's linears that share an input, in one launch each (`engine.cuda_qmv.three`, `engine.cuda_qmv.glu`).

On the H200 building and submitting a decode step took as long as the whole step, and submitting costs
per operation (docs/benchmarks.md, *GPU engine*): a block's q, k and v projections are three launches of our quantized kernel and its MLP's
gate and up projections two more, plus MLX's activation between them; a qwen3 block's per-head norms and
its two RoPEs four more. With ``qmv_fused`` (measured at load by `engine.decode_choice`, only beside our
linears) the compute path turns `engine.decode_kernels`' ``fused`` switch on for decode-sized forwards,
and with ``rope_fused`` (measured apart: a kernel that fails its check leaves the other in) its ``rope``
switch for one-token ones. Then:

- the attention modules' wired call (`engine.cpu_attention`) computes q, k and v in one launch
  (`projections`, ``fused``), and one token's per-head norms and RoPE in one more (`rotated`, ``rope``,
  `engine.cuda_qk_rope`; otherwise the module's own, `own_rotation`);
- each block's MLP of mlx-lm's llama, qwen2 or qwen3 (`wire` gives it `FusedCall`) computes ``silu(gate x) * up x``
  in one launch, then its down projection (``fused``).

Anything the kernels do not take (`cuda_qmv.fusable`: mixed bits or widths, a linear bias on the MLP, more
than `cuda_qmv.MAX_ROWS` rows) takes the layers' own calls.
"""
from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine import compiled_mlp, cuda_backend, cuda_qk_rope, cuda_qmv, decode_kernels


def projections(module: Any, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """An attention module's q, k and v projections of `x`: one launch while the switch is on and they fit."""
    linears = (module.q_proj, module.k_proj, module.v_proj)
    if _fits(module, x, linears):
        return cuda_qmv.three(x, linears)
    return tuple(linear(x) for linear in linears)


def rotated(module: Any, queries: mx.array, keys: mx.array, offset: int | mx.array) -> tuple[mx.array, mx.array]:
    """Queries and keys (the projections' outputs, (B, L, H * D) and (B, L, KV * D)) normalized per head where the
    module does and rotated at `offset`: (B, H, L, D), (B, KV, L, D). One token's in one launch
    (`engine.cuda_qk_rope`) while the switch is on and the kernel serves the module; else `own_rotation`."""
    dtype = queries.dtype
    if decode_kernels.rope_on() and queries.shape[:2] == (1, 1) and cuda_backend.kept_verdict(
            module, "_codectx_qk_rope", dtype, lambda: cuda_qk_rope.takes(module, dtype)):
        return cuda_qk_rope.qk_rope(module, queries, keys, offset)
    return own_rotation(module, queries, keys, offset)


def own_rotation(module: Any, queries: mx.array, keys: mx.array, offset: int | mx.array) -> tuple[mx.array, mx.array]:
    """`rotated` as the module's own step computes it: its per-head norms (qwen3's), then its RoPE."""
    B, L, _ = queries.shape
    queries = queries.reshape(B, L, module.n_heads, -1)
    keys = keys.reshape(B, L, module.n_kv_heads, -1)
    if "q_norm" in module:  # qwen3 normalizes each head before RoPE
        queries, keys = module.q_norm(queries), module.k_norm(keys)
    return (module.rope(queries.transpose(0, 2, 1, 3), offset=offset),
            module.rope(keys.transpose(0, 2, 1, 3), offset=offset))


class FusedCall:
    """Mixed into a block's MLP class by `wire`: decode-sized calls inside the switch take `cuda_qmv.glu`."""

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if args or kwargs or not _fits(self, x, (self.gate_proj, self.up_proj)):
            return super().__call__(x, *args, **kwargs)
        return self.down_proj(cuda_qmv.glu(x, self.gate_proj, self.up_proj))


SWIGLU = frozenset({("mlx_lm.models.llama", "MLP"), ("mlx_lm.models.qwen2", "MLP"), ("mlx_lm.models.qwen3", "MLP")})
"""mlx-lm's MLP classes whose call is ``down(silu(gate x) * up x)`` (others with the same projections, Gemma's,
take another activation)."""


def swiglu(mlp: Any) -> bool:
    """Whether `mlp`'s class is (or derives from, once wired) one of `SWIGLU`."""
    return any((cls.__module__, cls.__name__) in SWIGLU for cls in type(mlp).__mro__)


def wire(model: Any) -> int:
    """Give every block's `SWIGLU` MLP the fused call; how many have it."""
    mlps = [mlp for mlp in compiled_mlp.block_mlps(model) if swiglu(mlp)]
    for mlp in mlps:
        compiled_mlp.mix_in(mlp, FusedCall)
    return len(mlps)


def _fits(owner: Any, x: mx.array, linears: tuple) -> bool:
    """Whether `owner`'s `linears` take one launch for `x` now (the switch, the rows; `cuda_qmv.fusable`, answered
    once per module: asked once per layer per step)."""
    return decode_kernels.fused_on() and x.size // x.shape[-1] <= cuda_qmv.MAX_ROWS and cuda_backend.kept_verdict(
        owner, "_codectx_fusable", x.dtype, lambda: cuda_qmv.fusable(linears, x.dtype))
