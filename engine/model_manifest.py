"""A manifest of a converted model directory: the size and xxh3-128 of every file.

Written last, atomically, when a model is converted; checked before the model
is used, so a flipped byte, a truncated or missing file or a stray extra file
is found instead of loaded. xxh3 reads at memory speed, so the check costs
about one read of the weights (docs/architecture.md gives the measured time).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Collection

import xxhash

MANIFEST_NAME = "codectx-manifest.json"
_FORMAT = 1
_HASH = "xxh3_128"
_CHUNK = 4 << 20
_REQUIRED = ("config.json",)


def file_digest(path: Path) -> str:
    """xxh3-128 hex digest of a file, read in 4 MiB chunks."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: Path, kept: Collection[str] = ()) -> None:
    """Record every regular file of `directory` except `kept` names (temp file + rename).

    Args:
        directory: The converted model directory.
        kept: File names checked another way (the source GGUF and its SHA-256).
    """
    files = {
        path.name: {"size": path.stat().st_size, _HASH: file_digest(path)}
        for path in sorted(directory.iterdir())
        if path.is_file() and not path.is_symlink() and path.name not in {*kept, MANIFEST_NAME}
    }
    payload = json.dumps({"format": _FORMAT, "hash": _HASH, "files": files}, indent=2)
    tmp = directory / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    tmp.write_text(payload)
    os.replace(tmp, directory / MANIFEST_NAME)


def manifest_problem(directory: Path, kept: Collection[str] = ()) -> str | None:
    """What differs between `directory` and its manifest, or None when every file matches.

    Args:
        directory: The converted model directory.
        kept: File names the manifest leaves out (as given to `write_manifest`).

    Returns:
        A short description of the first problem found: no or unreadable
        manifest, a missing, resized, changed or unlisted file.
    """
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError) as err:
        return f"unreadable manifest ({err})"
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if (not isinstance(listed, dict) or manifest.get("format") != _FORMAT
            or not all(_plain(name) and _record(row) for name, row in listed.items())):
        return "malformed manifest"
    for name in _REQUIRED:
        if name not in listed:
            return f"the manifest does not list {name}"
    if not any(name.startswith("model") and name.endswith(".safetensors") for name in listed):
        return "the manifest lists no model*.safetensors weights"
    try:
        present = {p.name for p in directory.iterdir()} - {*kept, MANIFEST_NAME}
    except OSError as err:
        return f"cannot list {directory} ({err})"
    for name in sorted(present - set(listed)):
        if not name.startswith(f".{MANIFEST_NAME}."):  # a writer's temp file is not a stray
            return f"unexpected file {name}"
    for name, row in sorted(listed.items()):
        path = directory / name
        if not path.is_file() or path.is_symlink():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != row["size"]:
            return f"{name} is {size:,} bytes, the manifest says {row['size']:,}"
        if file_digest(path) != row[_HASH]:
            return f"{name} does not match its manifest checksum"
    return None


def _plain(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _record(row: object) -> bool:
    return (isinstance(row, dict) and isinstance(row.get("size"), int)
            and isinstance(row.get(_HASH), str))
