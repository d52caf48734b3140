"""`codectx models`: the models already on this machine and whether codectx can load them.

Ollama's library, LM Studio's models folder, the Hugging Face hub cache and codectx's own cache
(`engine.model_library`); nothing is downloaded. The first column is what `--model` (and the
`model.name` setting) takes.

    codectx models [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence, TextIO


def human_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codectx models", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per model")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    from engine.model_library import find_models

    models = find_models()
    if args.json:
        for m in models:
            out.write(json.dumps({"spec": m.spec, "source": m.source, "path": str(m.path), "format": m.format,
                                  "architecture": m.architecture, "quantisation": m.quantisation,
                                  "size_bytes": m.size_bytes, "loadable": m.loadable, "why_not": m.why_not}) + "\n")
        return 0
    if not models:
        out.write("no models found (Ollama, LM Studio, the Hugging Face cache, codectx's cache)\n")
        return 0
    rows = [("model (--model)", "source", "format", "architecture", "quantisation", "size", "loads")]
    rows += [(m.spec, m.source, m.format, m.architecture or "?", m.quantisation or "?", human_bytes(m.size_bytes),
              "yes" if m.loadable else f"no: {m.why_not}") for m in models]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] + "\n")
    return 0
