"""Linear-mode measurements kept per device and model shape, so a model is timed once per device.

One JSON file, ``CODECTX_HOME/compute/linear-modes.json``: key -> the timings
`engine.linear_mode.measure_layer` took. The key is an xxh3 digest of what
the timings depend on: the device (name, architecture, MLX's default device
type), the MLX version, the quantized linears' shapes, bits, group sizes,
modes and dtypes, and the ladder and format of the measurement. Models of one
shape share an entry (their weights do not change the timings).

The file is an optimization: one that cannot be read, is not JSON or has a
malformed entry is measured around (and rewritten), and one that cannot be
written leaves the measurement in this process only, with a warning.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import xxhash

from engine.archive_files import write_atomically
from engine.paths import codectx_home

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_MAX_FILE_BYTES = 4 << 20

Timings = dict[int, tuple[float, float]]
"""Rows -> (quantized seconds, dequantized seconds), as `engine.linear_mode.measure_layer` returns them."""


def cache_path() -> Path:
    """``<codectx home>/compute/linear-modes.json``."""
    return codectx_home() / "compute" / "linear-modes.json"


def device_description() -> dict[str, str]:
    """The device the timings belong to."""
    try:
        info = mx.device_info()
    except (RuntimeError, AttributeError):  # a backend that describes no device
        info = {}
    return {"device": str(info.get("device_name", "")), "architecture": str(info.get("architecture", "")),
            "type": str(mx.default_device().type).rsplit(".", 1)[-1], "mlx": mx.__version__}


class LinearModeCache:
    """The cached measurements (one JSON file).

    Args:
        path: The file (default `cache_path()`).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_path()

    def key(self, linears: Sequence[Any], method: dict[str, Any]) -> str:
        """The entry key of a model whose block linears are `linears` on this device, measured by `method`
        (the ladder and anything else that changes what is timed)."""
        shapes = sorted({(tuple(m.weight.shape), m.bits, m.group_size, m.mode, str(m["scales"].dtype))
                         for m in linears})
        payload = {"device": device_description(), "linears": shapes, "method": method, "format": FORMAT_VERSION}
        return xxhash.xxh3_64_hexdigest(json.dumps(payload, sort_keys=True).encode())

    def get(self, key: str, parse: Callable[[str], Any] = int) -> Timings | None:
        """The cached timings under `key`, or None (absent, or an entry that does not parse or has no rows).

        Args:
            parse: Turns a stored key back into the caller's (rows for the linear mode, a
                kernel's name for `engine.decode_choice`).
        """
        return self.timings_of(self._read().get(key), parse)

    @staticmethod
    def timings_of(entry: Any, parse: Callable[[str], Any] = int) -> Timings | None:
        """The timings an entry (as `entries()` returns it) holds, or None when it does not parse."""
        try:
            timings = {parse(rows): (float(pair[0]), float(pair[1])) for rows, pair in entry["timings"].items()}
        except (TypeError, KeyError, ValueError, IndexError, AttributeError):
            return None
        return timings or None

    def put(self, key: str, timings: Timings) -> None:
        """Store `timings` under `key` (a write failure is a warning: the next load measures again)."""
        entries = self._read()
        entries[key] = {"device": device_description(),
                        "timings": {str(rows): list(pair) for rows, pair in sorted(timings.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps(entries, indent=1, sort_keys=True).encode())
        except OSError as err:
            logger.warning("linear mode: cannot cache the measurement in %s: %s", self.path, err)

    def entries(self) -> dict[str, Any]:
        """Every entry as stored (for `codectx doctor`)."""
        return self._read()

    def _read(self) -> dict[str, Any]:
        try:
            if os.path.getsize(self.path) > _MAX_FILE_BYTES:
                raise ValueError("too large")
            entries = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            logger.warning("linear mode: ignoring %s (%s); measuring again", self.path, err)
            return {}
        return entries if isinstance(entries, dict) else {}
