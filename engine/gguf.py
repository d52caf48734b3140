"""Load a GGUF model: llama, qwen2, qwen3 or gemma3, in any quantisation the `gguf` package reads.

The file is converted once into an mlx-lm directory in the cache
(`engine.gguf_convert`) and loaded from there like any mlx-lm model; later
loads of the same file at the same bits skip the conversion. What can be
loaded is decided here, once: `loadable_problem` is what `codectx models`
reports and what `load_gguf` enforces.
"""
from __future__ import annotations

from pathlib import Path

from engine.gguf_arch import SUPPORTED_ARCHITECTURES
from engine.gguf_convert import GGUF_BITS, ensure_converted
from engine.gguf_read import GgufFile, convertible_types, open_gguf
from engine.loaded_model import LoadedModel, file_edges_hash

__all__ = ["DEFAULT_GGUF_BITS", "GGUF_BITS", "SUPPORTED_ARCHITECTURES", "load_gguf", "loadable_problem"]

DEFAULT_GGUF_BITS = 4
"""Bits a GGUF's weights are requantized to unless the `model.ggufBits` setting says otherwise.

4: tensors the file holds in 4 bits or fewer keep their grid exactly and finer ones go
to 8 bits (`engine.gguf_convert`), so quality stays the file's own (the default model, a
Q4_1 file with a Q8_0 embedding: next-token KL 2.2e-5 against its float32 weights, the
same as at 8 bits) at about the file's memory."""


def loadable_problem(source: GgufFile) -> str | None:
    """Why codectx cannot load this GGUF (architecture or a tensor type), or None when it can."""
    arch = source.metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        return f"architecture {arch}: not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
    odd = sorted(set(source.type_counts()) - set(convertible_types()))
    if odd:
        return f"tensor type {', '.join(odd)}: cannot be converted"
    return None


def load_gguf(path: Path, *, model_id: str | None = None, bits: int | None = None,
              progress: bool = True) -> LoadedModel:
    """Load a GGUF file, converting it into the cache first when needed.

    Args:
        path: The GGUF file (any name: Ollama's blobs have no extension).
        model_id: Name to report; defaults to the file's stem.
        bits: 4 or 8 (MLX affine), 16 (float16) or 32 (float32); None for `DEFAULT_GGUF_BITS`.
        progress: Show a progress bar on stderr while converting.

    Raises:
        ModelLoadError: Truncated or corrupt file, unsupported architecture,
            tensor type or tokenizer (nothing half-written is left in the cache).
    """
    from engine.loading import load_directory

    path = Path(path)
    bits = DEFAULT_GGUF_BITS if bits is None else bits
    if bits not in GGUF_BITS:
        raise ValueError(f"bits must be one of {GGUF_BITS}, got {bits}")
    directory = ensure_converted(path, bits, progress=progress)
    # the source file's identity and the bits: checkpoints of two conversions never mix
    weight_hash = f"{file_edges_hash(path)}-b{bits}"
    loaded = load_directory(directory, model_id=model_id or path.stem, weight_hash=weight_hash)
    loaded.path = path
    return loaded


def gguf_summary(path: Path) -> tuple[GgufFile, str | None]:
    """The opened file and why it cannot be loaded (None when it can)."""
    source = open_gguf(path)
    return source, loadable_problem(source)
