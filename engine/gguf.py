"""Load a GGUF model: llama, qwen2, qwen3 or gemma3, in any quantisation the `gguf` package reads.

The file is converted once into an mlx-lm directory in the cache
(`engine.gguf_convert`) and loaded from there like any mlx-lm model
(`engine.loading.load_gguf`); later loads of the same file at the same bits skip
the conversion. What can be loaded is decided here, once: `loadable_problem` is
what `codectx models` reports.
"""
from __future__ import annotations


from engine.gguf_arch import SUPPORTED_ARCHITECTURES
from engine.gguf_convert import GGUF_BITS
from engine.gguf_read import GgufFile, convertible_types

__all__ = ["DEFAULT_GGUF_BITS", "GGUF_BITS", "SUPPORTED_ARCHITECTURES", "loadable_problem"]

DEFAULT_GGUF_BITS = 4
"""Bits a GGUF's weights are requantized to unless the `model.ggufBits` setting says otherwise.

4: tensors the file holds in 4 bits or fewer keep their grid exactly and finer ones go
to 8 bits (`engine.gguf_convert`), so quality stays the file's own (the default model, a
Q4_1 file with a Q8_0 embedding: next-token KL 1.9e-5 against its float32 weights, the
same as at 8 bits, with a 94 MiB conversion instead of 144: `python bench/models.py`,
docs/benchmarks.md "Model files") at about the file's memory."""


def loadable_problem(source: GgufFile) -> str | None:
    """Why codectx cannot load this GGUF (architecture or a tensor type), or None when it can."""
    arch = source.metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        return f"architecture {arch}: not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
    odd = sorted(set(source.type_counts()) - set(convertible_types()))
    if odd:
        return f"tensor type {', '.join(odd)}: cannot be converted"
    return None
