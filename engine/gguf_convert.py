"""Convert a GGUF file into an mlx-lm model directory, once, atomically, into the cache.

Every tensor is dequantized by the `gguf` package (engine/gguf_read.py) and,
for the weight matrices, quantized once more to MLX's affine format at the
chosen bits (engine/affine_quant.py: groups already on a grid that fits stay exact). One target for all GGUF types keeps the engine on one kind of
weight whatever the file held (Q4_K_M files mix Q4_K, Q6_K and F32 tensors).

`bits`: 4 or 8 (MLX affine, group size 32: llama.cpp's legacy quants use
blocks of 32 too), 16 (float16, no quantization) or 32 (float32: the exact
dequantized values, what the default model uses). At 4 bits a tensor the file
holds more finely (Q5/Q6/Q8, floats: a Q4_K_M file keeps its output and some
down projections in Q6_K on purpose) is quantized to 8 bits instead: squeezing
the default model's Q8_0 embedding to 4 bits gave a next-token KL of 0.048 against
its float32 weights, 1.9e-5 with the rule (the first from one throwaway run before
the rule existed, the second from `python bench/models.py`).

The cache entry is `<CODECTX_HOME>/models/gguf/<stem>-<hash>-b<bits>/`: config.json,
model-NNNNN.safetensors shards, tokenizer.json, tokenizer_config.json and
conversion.json (the source file, its hash, the converter version, the bits) and
codectx-manifest.json (size and checksum of every file, `engine.model_manifest`),
checked before each load: a damaged entry is converted again.
It is built under a temporary name and renamed into place, so it is complete or
absent; an interrupted conversion leaves only a staging directory that the next
one removes.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import mlx.core as mx
from engine.affine_quant import quantize_affine
from engine.errors import ModelLoadError
from engine.gguf_arch import Architecture, architecture, hf_config, hf_name, hf_values
from engine.gguf_read import GgufFile, GgufTensor, open_gguf
from engine.gguf_tokenizer import gguf_tokenizer, tokenizer_config
from engine.loaded_model import file_edges_hash
from engine.model_manifest import manifest_problem, write_manifest
from engine.paths import exclusive_lock, models_dir, remove_stale_staging

log = logging.getLogger(__name__)

CONVERTER_VERSION = 3
"""Bumped when a conversion's output changes; older cache entries are then rebuilt."""
GGUF_BITS = (4, 8, 16, 32)
GROUP_SIZE = 32
_SHARD_BYTES = 1 << 30
_FINE_TYPES = frozenset({"F32", "F16", "BF16", "F64", "Q8_0", "Q8_1", "Q8_K", "Q6_K", "Q5_0", "Q5_1", "Q5_K"})
"""GGML types with more than ~4.5 bits a weight: kept at 8 bits when the target is 4."""
_GRID_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0"})
"""Types whose values lie on one affine grid per 32: worth keeping exact (K-quants with blocks
of 16, i-quants' lattices and floats are not)."""
_CONVERSION = "conversion.json"


def converted_dir(gguf_path: Path, bits: int) -> Path:
    """Where the conversion of `gguf_path` at `bits` lives in the cache."""
    gguf_path = Path(gguf_path)
    return models_dir() / "gguf" / f"{gguf_path.stem[:48]}-{file_edges_hash(gguf_path)}-b{bits}"


def ensure_converted(gguf_path: Path, bits: int, *, progress: bool = True) -> Path:
    """The cached conversion of `gguf_path` at `bits`, converting it first when absent or stale.

    Concurrent callers (two servers starting) wait for one conversion.

    Raises:
        ModelLoadError: The file cannot be read or converted (nothing is left in the cache).
    """
    target = converted_dir(gguf_path, bits)
    if _is_current(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f".{target.name}.lock", f"the conversion of {Path(gguf_path).name}"):
        if _is_current(target):
            return target  # another process converted it while we waited
        if target.exists():
            log.warning("rebuilding the stale conversion %s", target)
            shutil.rmtree(target)
        remove_stale_staging(target.parent, target.name)
        convert_gguf(gguf_path, target, bits=bits, progress=progress)
    return target


def convert_gguf(gguf_path: Path, out_dir: Path, *, bits: int = 32, progress: bool = False) -> Path:
    """Write a GGUF as an mlx-lm model directory, atomically.

    Args:
        gguf_path: The GGUF file.
        out_dir: The directory to create; must not exist yet.
        bits: 4 or 8 (MLX affine), 16 (float16) or 32 (float32, exact).
        progress: Show a progress bar on stderr.

    Returns:
        `out_dir`.

    Raises:
        ModelLoadError: The GGUF cannot be read, or its architecture, a tensor type or
            its tokenizer is unsupported.
        FileExistsError: `out_dir` already exists.
        ValueError: `bits` is not one of `GGUF_BITS`.
    """
    if bits not in GGUF_BITS:
        raise ValueError(f"bits must be one of {GGUF_BITS}, got {bits}")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists")
    started = time.monotonic()
    source = open_gguf(Path(gguf_path))
    arch_map = architecture(source.metadata)
    config = _config(source, bits)
    hf = gguf_tokenizer(source.metadata)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        shards, finer = _write_weights(source, arch_map, bits, staging, progress)
        if finer:
            config["quantization"].update({module: {"group_size": GROUP_SIZE, "bits": 8} for module in finer})
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        hf.backend_tokenizer.save(str(staging / "tokenizer.json"))
        (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(hf, source.metadata), indent=2))
        (staging / _CONVERSION).write_text(json.dumps(_conversion(source, bits, shards, started), indent=2))
        write_manifest(staging)
        staging.chmod(0o755)  # mkdtemp creates it private
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("converted %s to %s (%d-bit) in %.1f s", gguf_path, out_dir, bits, time.monotonic() - started)
    return out_dir


def _config(source: GgufFile, bits: int) -> dict[str, Any]:
    by_name = {t.name: t for t in source.tensors}
    if "token_embd.weight" not in by_name:
        raise ModelLoadError(f"{source.path}: no token_embd.weight tensor")
    rope = by_name.get("rope_freqs.weight")
    config = hf_config(source.metadata, set(by_name), by_name["token_embd.weight"].shape[0],
                       rope.dequantized() if rope is not None else None)
    if bits in (4, 8):
        config["quantization"] = {"group_size": GROUP_SIZE, "bits": bits}
    return config


def _write_weights(source: GgufFile, arch_map: Architecture, bits: int, staging: Path,
                   progress: bool) -> tuple[int, list[str]]:
    """Convert every tensor and write them in shards of about 1 GiB.

    Returns:
        The shard count and the modules quantized at 8 bits under a 4-bit target.
    """
    shard: dict[str, mx.array] = {}
    finer: list[str] = []
    size, count = 0, 0
    for name, value in _converted(source, arch_map, bits, progress, finer):
        shard[name] = value
        size += value.nbytes
        if size >= _SHARD_BYTES:
            count += 1
            mx.save_safetensors(str(staging / f"model-{count:05d}.safetensors"), shard, metadata={"format": "mlx"})
            shard, size = {}, 0
    if count == 0:
        mx.save_safetensors(str(staging / "model.safetensors"), shard, metadata={"format": "mlx"})
        return 1, finer
    if shard:
        count += 1
        mx.save_safetensors(str(staging / f"model-{count:05d}.safetensors"), shard, metadata={"format": "mlx"})
    return count, finer


def _converted(source: GgufFile, arch_map: Architecture, bits: int, progress: bool,
               finer: list[str]) -> Iterator[tuple[str, mx.array]]:
    from tqdm import tqdm

    total = sum(t.nbytes for t in source.tensors)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"converting {source.path.name}",
              disable=None if progress else True, leave=False) as bar:  # None: only on a terminal
        for tensor in source.tensors:
            hf = hf_name(tensor.name, arch_map)
            if hf is not None:
                yield from _tensor_parts(hf, tensor, arch_map, bits, finer)
            bar.update(tensor.nbytes)


def _tensor_parts(hf: str, tensor: GgufTensor, arch_map: Architecture, bits: int,
                  finer: list[str]) -> Iterator[tuple[str, mx.array]]:
    values = hf_values(hf, tensor.dequantized(), arch_map)
    if bits in (4, 8) and _quantizable(hf, values.shape):
        module = hf.rsplit(".", 1)[0]
        if bits == 4 and tensor.kind in _FINE_TYPES:
            bits = 8
            finer.append(module)
        weight, scales, biases = quantize_affine(values, bits, GROUP_SIZE, find_grids=tensor.kind in _GRID_TYPES)
        yield hf, mx.array(weight)
        yield f"{module}.scales", mx.array(scales)
        yield f"{module}.biases", mx.array(biases)
    else:
        yield hf, mx.array(values).astype(mx.float32 if bits == 32 else mx.float16)


def _quantizable(hf: str, shape: tuple[int, ...]) -> bool:
    """Matrices (linear and embedding weights) whose rows split into whole groups."""
    return hf.endswith(".weight") and len(shape) == 2 and shape[-1] % GROUP_SIZE == 0 and "norm" not in hf


def _conversion(source: GgufFile, bits: int, shards: int, started: float) -> dict[str, Any]:
    stat = source.path.stat()
    return {
        "converter_version": CONVERTER_VERSION,
        "source": str(source.path.resolve()),
        "source_bytes": stat.st_size,
        "source_hash": file_edges_hash(source.path),
        "architecture": source.architecture,
        "tensor_types": source.type_counts(),
        "bits": bits,
        "group_size": GROUP_SIZE if bits in (4, 8) else None,
        "shards": shards,
        "seconds": round(time.monotonic() - started, 2),
    }


def read_conversion(directory: Path) -> dict[str, Any] | None:
    """What a cached conversion was made from (conversion.json), or None when unreadable or not an object."""
    try:
        data = json.loads((Path(directory) / _CONVERSION).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _is_current(target: Path) -> bool:
    if not target.is_dir():
        return False
    conversion = read_conversion(target)
    if conversion is None or conversion.get("converter_version") != CONVERTER_VERSION:
        return False
    problem = manifest_problem(target)
    if problem is not None:
        log.warning("the conversion %s is damaged (%s); converting again", target, problem)
    return problem is None
