"""`codectx models`: the models already on this machine and whether codectx can load them.

Ollama's library, LM Studio's models folder, the Hugging Face hub cache and codectx's own cache
(`engine.model_library`); nothing is downloaded. The first column is what `--model` (and the
`model.name` setting) takes. Then which of them fits this machine best for code questions, and what
to get when none does (`server.core.model_choice` decides).

    codectx models [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence, TextIO

from server.core.model_choice import Assessment, Budget, Choice, choose, fit_reason, profile_of


def human_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codectx models", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per model, then one holding the recommendation")
    parser.add_argument("--gguf-bits", type=int, choices=(4, 8, 16), default=None,
                        help="bits a .gguf model would be converted to, for the memory it needs (default 4)")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    from engine.machine import this_machine
    from engine.model_library import find_models

    models = find_models()
    choice = choose([profile_of(m) for m in models], this_machine(), Budget(gguf_bits=args.gguf_bits))
    if args.json:
        for m, a in zip(models, choice.assessed):
            out.write(json.dumps({"spec": m.spec, "source": m.source, "path": str(m.path), "format": m.format,
                                  "architecture": m.architecture, "quantisation": m.quantisation,
                                  "size_bytes": m.size_bytes, "loadable": m.loadable, "why_not": m.why_not,
                                  "family": a.family.label, "parameters": a.parameters,
                                  "needs_bytes": a.needs_bytes, "fits": a.fits}) + "\n")
        out.write(json.dumps({"recommendation": choice.to_json()}) + "\n")
        return 0
    if not models:
        out.write("no models found (Ollama, LM Studio, the Hugging Face cache, codectx's cache)\n")
    else:
        rows = [("model (--model)", "source", "format", "architecture", "quantisation", "size", "needs", "loads")]
        rows += [(m.spec, m.source, m.format, m.architecture or "?", m.quantisation or "?", human_bytes(m.size_bytes),
                  _needs(a), "yes" if m.loadable else f"no: {m.why_not}") for m, a in zip(models, choice.assessed)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] + "\n")
    out.write("\n" + "\n".join(recommendation_lines(choice)) + "\n")
    return 0


def recommendation_lines(choice: Choice) -> list[str]:
    """The recommendation as text: the model and why, then what to get when something is better."""
    head = f"recommended for code questions on this machine ({choice.machine.describe()}): "
    lines = [head + (choice.best.spec if choice.best else "none of the models found"), f"  why: {choice.why}"]
    get = choice.get
    if get is not None:
        lead = "better for this machine" if choice.best else "get"
        lines.append(f"{lead}: {get.command} ({get.download}), then --model {get.spec}")
        lines.append(f"  why: {fit_reason(get.assessment, choice.machine, choice.budget)}")
        if not get.loads_now:
            lines.append(f"  (this codectx does not load {get.assessment.profile.architecture} GGUF yet)")
    return lines


def _needs(a: Assessment) -> str:
    """The memory a model needs here: "8.4 GiB", "20.6 GiB, too big", or "?" when unknown."""
    if a.needs_bytes is None:
        return "?"
    return f"{a.needs_bytes / 1024**3:.1f} GiB" + ("" if a.fits else ", too big")
