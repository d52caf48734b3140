"""The policy fingerprint: everything besides the tokens that decides what a cache holds.

Two caches over the same tokens are interchangeable only when the model, its
weights, the compute dtype, the KV storage (bits, group size), the attention
policy (global region G, window W, dense tail kinds), the compute path that
ran (`engine.compute.ComputePath.identity`) and the numerics of the engine
are the same. `CachePolicy.fingerprint()` folds all of them into one
hex digest that seeds every checkpoint's chained hash and names the archive
directory, so a change to any of them is a clean "policy mismatch".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import msgpack
import xxhash

# Bump when a change to prefill/decode arithmetic can change cached state
# (chunking rule, mask construction, quantization path).
NUMERICS_VERSION = 2  # 2: the engine's 8-bit KV attends over dequantized slices (engine.qkv)


@dataclass(frozen=True)
class CachePolicy:
    """What, besides token ids, a checkpoint's content depends on.

    Args:
        model_id: The model's name or path as loaded.
        weight_hash: A digest of the weights (from `engine.loading`).
        dtype: The compute dtype of activations and fp KV ("float32", "float16", ...).
        kv_bits: 16 (model dtype) or 8 (quantized storage).
        kv_group_size: Quantization group size (ignored in the digest when kv_bits=16).
        global_tokens: Windowed prefill's global region G; None for exact attention.
        window_tokens: Windowed prefill's recent window W; None for exact attention.
        dense_kinds: Segment kinds always prefilled with dense attention (the tail).
        approximation: True when prefill attention is windowed (`approximation.enabled`).
        dense_tail: Dense positions before the end of the stable segments (windowed only).
        continuation_tail: Dense positions at the end of a plain token prompt (windowed only).
        window_form: "block" or "query" (windowed only).
        prefill_chunk: Prefill chunk size; chunking is part of the numerics.
        compute: The resolved compute path (`ComputePath.identity()`): who
            computes attention and the layers (MLX or NumPy), whether decode
            steps are compiled, and the BLAS under MLX's matmuls.
        numerics_version: `NUMERICS_VERSION` of the code that built the cache.
    """

    model_id: str
    weight_hash: str
    dtype: str
    kv_bits: int = 16
    kv_group_size: int = 64
    global_tokens: int | None = None
    window_tokens: int | None = None
    dense_kinds: tuple[str, ...] = ()
    approximation: bool = False
    dense_tail: int | None = None
    continuation_tail: int | None = None
    window_form: str | None = None
    prefill_chunk: int = 512
    compute: str = "exact"
    numerics_version: int = NUMERICS_VERSION

    def fingerprint(self) -> str:
        """A 16-hex-digit digest of every field (stable across processes)."""
        fields = asdict(self)
        if self.kv_bits == 16:
            fields["kv_group_size"] = 0
        fields["dense_kinds"] = sorted(self.dense_kinds)
        packed = msgpack.packb(sorted(fields.items()), use_bin_type=True)
        return xxhash.xxh3_64_hexdigest(packed)

    def describe(self) -> dict:
        """The fields as a plain dict (for stats and the archive index)."""
        return asdict(self)
