"""Models already on the machine: Ollama's library, LM Studio's models folder, the Hugging Face
hub cache and codectx's own cache. Nothing is downloaded.

- Ollama (`$OLLAMA_MODELS`, else `~/.ollama/models`): `manifests/<registry>/<namespace>/<name>/<tag>`
  is JSON whose layer of media type `application/vnd.ollama.image.model` names the GGUF blob by
  digest (`sha256:<hex>` -> `blobs/sha256-<hex>`). Spec: `ollama:NAME[:TAG]` (tag `latest` by
  default; `NAMESPACE/NAME` outside the `library` namespace).
- LM Studio (`$CODECTX_LMSTUDIO_MODELS`, else `~/.lmstudio/models`, `~/.cache/lm-studio/models`):
  `<publisher>/<repository>/<file>.gguf`. Spec: `lmstudio:PUBLISHER/REPOSITORY[/FILE]`.
- Hugging Face hub cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`):
  `models--<org>--<name>/snapshots/<revision>/`, an mlx-lm directory or GGUF files.
- codectx's cache (`<CODECTX_HOME>/models`).

A GGUF's architecture and quantisation come from its header (the `gguf` package's reader,
memory-mapped: the weights are not read). Whether codectx can load it is `loadable` /
`why_not`, by what `engine.gguf.loadable_problem` says.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from engine.errors import ModelNotFoundError
from engine.paths import models_dir

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"


@dataclass(frozen=True)
class FoundModel:
    """One model found on the machine.

    Attributes:
        spec: What `--model` takes for it.
        source: "ollama", "lmstudio", "hf-cache" or "codectx".
        path: The GGUF file or the model directory.
        format: "gguf" or "mlx" (an mlx-lm directory).
        architecture: From the GGUF header or config.json (None when unknown).
        quantisation: The GGUF file type (e.g. "Q4_K_M"), or None.
        size_bytes: On disk.
        why_not: Why codectx cannot load it; None when it can.
        header: A GGUF's parsed header (`engine.gguf_read.GgufFile`), kept so later readers
            (the model's shape) do not parse it again; None for directories and unreadable files.
    """

    spec: str
    source: str
    path: Path
    format: str
    architecture: str | None
    quantisation: str | None
    size_bytes: int
    why_not: str | None = None
    header: Any = field(default=None, repr=False, compare=False)

    @property
    def loadable(self) -> bool:
        return self.why_not is None


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def lmstudio_roots() -> list[Path]:
    configured = os.environ.get("CODECTX_LMSTUDIO_MODELS")
    if configured:
        return [Path(configured).expanduser()]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    return home / "hub"


def find_models() -> list[FoundModel]:
    """Every model found, by source, in a stable order."""
    return [*_ollama_models(), *_lmstudio_models(), *_hf_models(), *_codectx_models()]


def resolve_spec(spec: str) -> Path | None:
    """The GGUF path of an `ollama:` or `lmstudio:` spec; None for any other spec.

    Raises:
        ModelNotFoundError: No such model, or its manifest names a blob that is missing.
    """
    if spec.startswith("ollama:"):
        return _ollama_blob(spec[len("ollama:"):])
    if spec.startswith("lmstudio:"):
        return _lmstudio_file(spec[len("lmstudio:"):])
    return None


# -- Ollama -------------------------------------------------------------------------------------

def _ollama_manifests() -> Iterator[tuple[str, Path]]:
    """(spec, manifest path) for every tag in Ollama's library."""
    base = ollama_root() / "manifests"
    if not base.is_dir():
        return
    for manifest in sorted(p for p in base.glob("*/*/*/*") if p.is_file()):
        registry, namespace, name, tag = manifest.relative_to(base).parts
        short = name if namespace == "library" else f"{namespace}/{name}"
        prefix = "" if registry == "registry.ollama.ai" else f"{registry}/"
        yield f"ollama:{prefix}{short}:{tag}", manifest


def _model_layer(manifest: Path) -> Path:
    """The GGUF blob a manifest names (it may be missing)."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers") or []
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(f"unreadable Ollama manifest {manifest}: {err}") from err
    digest = next((layer.get("digest") for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER), None)
    if not digest or not str(digest).startswith("sha256:"):
        raise ModelNotFoundError(f"the Ollama manifest {manifest} names no model layer")
    return ollama_root() / "blobs" / f"sha256-{digest.split(':', 1)[1]}"


def _ollama_blob(name: str) -> Path:
    wanted = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
    manifests = dict(_ollama_manifests())
    manifest = manifests.get(f"ollama:{wanted}")
    if manifest is None:
        known = ", ".join(spec for spec in manifests) or "none"
        raise ModelNotFoundError(f"no Ollama model {wanted!r} in {ollama_root()} (found: {known})")
    blob = _model_layer(manifest)
    if not blob.is_file():
        raise ModelNotFoundError(f"the Ollama manifest for {wanted} names the blob {blob.name}, which is missing "
                                 f"from {blob.parent}")
    return blob


def _ollama_models() -> Iterator[FoundModel]:
    for spec, manifest in _ollama_manifests():
        try:
            blob = _model_layer(manifest)
        except ModelNotFoundError as err:
            yield FoundModel(spec, "ollama", manifest, "gguf", None, None, 0, str(err))
            continue
        if not blob.is_file():
            yield FoundModel(spec, "ollama", blob, "gguf", None, None, 0, f"blob {blob.name} is missing")
            continue
        yield gguf_model(spec, "ollama", blob)


# -- LM Studio, the hub cache, codectx's cache ---------------------------------------------------

def _lmstudio_files() -> Iterator[tuple[str, Path]]:
    for root in lmstudio_roots():
        if root.is_dir():
            for path in sorted(root.glob("*/*/*.gguf")):
                yield path.relative_to(root).as_posix(), path


def _lmstudio_file(name: str) -> Path:
    files = list(_lmstudio_files())
    exact = [path for rel, path in files if rel == name]
    matches = exact or [path for rel, path in files if rel.rsplit("/", 1)[0] == name]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(rel for rel, _ in files) or "none"
        raise ModelNotFoundError(f"no LM Studio model {name!r} (found: {known})")
    raise ModelNotFoundError(f"LM Studio has several files for {name!r}: name one "
                             f"({', '.join(p.name for p in matches)})")


def _lmstudio_models() -> Iterator[FoundModel]:
    for rel, path in _lmstudio_files():
        yield gguf_model(f"lmstudio:{rel}", "lmstudio", path)


def _hf_models() -> Iterator[FoundModel]:
    cache = hf_cache()
    for snapshot in sorted(cache.glob("models--*/snapshots/*")) if cache.is_dir() else []:
        repo = snapshot.parent.parent.name[len("models--"):].replace("--", "/")
        if (snapshot / "config.json").is_file():
            yield directory_model(repo, "hf-cache", snapshot)
        for path in sorted(snapshot.glob("*.gguf")):
            yield gguf_model(str(path), "hf-cache", path)


def _codectx_models() -> Iterator[FoundModel]:
    root = models_dir()
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if (folder / "config.json").is_file():
            yield directory_model(str(folder), "codectx", folder)


# -- what a file or folder holds ----------------------------------------------------------------

def gguf_model(spec: str, source: str, path: Path) -> FoundModel:
    """A GGUF file's entry, from its header; loadable as `engine.gguf.loadable_problem` says."""
    from engine.gguf import loadable_problem
    from engine.gguf_read import open_gguf

    size = path.stat().st_size
    try:
        opened = open_gguf(path)
        architecture, quantisation = opened.architecture, gguf_quantisation(opened)
    except Exception as err:  # noqa: BLE001 - any unreadable file is reported, not raised
        return FoundModel(spec, source, path, "gguf", None, None, size, f"unreadable GGUF: {err}")
    return FoundModel(spec, source, path, "gguf", architecture, quantisation, size, loadable_problem(opened),
                      header=opened)


def gguf_quantisation(opened: Any) -> str:
    """The file's quantisation as llama.cpp names it (`general.file_type`: "Q4_K_M"), else the
    type most of its tensors have."""
    from gguf import LlamaFileType

    file_type = opened.metadata.get("general.file_type")
    if isinstance(file_type, int):
        try:
            name = LlamaFileType(file_type).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    counts = opened.type_counts()
    return max(counts, key=counts.get) if counts else "unknown"


def directory_model(spec: str, source: str, folder: Path) -> FoundModel:
    """An mlx-lm directory's entry, from its config.json."""
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return FoundModel(spec, source, folder, "mlx", None, None, size, f"unreadable config.json: {err}")
    bits = (config.get("quantization") or {}).get("bits")
    has_weights = any(folder.glob("*.safetensors"))
    return FoundModel(spec, source, folder, "mlx", config.get("model_type"), f"{bits}-bit" if bits else None, size,
                      None if has_weights else "no *.safetensors weights")
