"""`codectx context`: show the prefix layout codectx builds for a repository.

A table of order, path, language, tokens, hash prefix and reason (pinned,
dependency order / rank, hot, map-only, omitted), totals, and the files the scan
skipped with their reasons. `--json` prints the same as one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from context.errors import ContextError
from context.layout import Layout
from context.scan import iter_reasons
from engine.request import SegmentKind
from server.exit_status import UsageError, check_folder, status_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `context`'s options to a (sub)parser."""
    parser.add_argument("--repo", default=".", help="workspace folder (default: current folder)")
    parser.add_argument("--budget", type=int, default=None, help="token budget (default: unlimited)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--tokenizer", help="folder with tokenizer.json (default: the default model's)")
    parser.add_argument("--include", action="append", default=[], metavar="GLOB", help="only these files")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave these out")
    parser.add_argument("--pin", action="append", default=None, metavar="GLOB", help="always first")
    parser.add_argument("--all-skipped", action="store_true", help="list every skipped file")


def load_tokenizer(folder: str | None):
    """A `TextTokenizer` from a folder, else the cached default model's tokenizer.

    Raises:
        ContextError: No folder given and the default model is not in the cache.
    """
    from context.hf_tokenizer import HFTokenizer

    if folder:
        return HFTokenizer.from_dir(folder)
    from engine.default_model import cached_default_model

    model = cached_default_model()
    if model is None or not (model.directory / "tokenizer.json").is_file():
        raise ContextError("the default model is not in the cache yet: pass --tokenizer DIR "
                           "(a folder with tokenizer.json) or fetch the default model first")
    return HFTokenizer.from_dir(model.directory)


def run(args: argparse.Namespace) -> int:
    """Builds the layout and prints it; returns the exit status."""
    from context.workspace import DEFAULT_PINS, Workspace

    try:
        root = check_folder("--repo", args.repo)
        try:
            tokenizer = load_tokenizer(args.tokenizer)
        except ContextError as err:
            raise UsageError(str(err)) from err
        bar = progress_bar(sys.stderr)
        ws = Workspace(root, tokenizer, budget=args.budget, pins=args.pin or DEFAULT_PINS,
                       include=args.include, exclude=args.exclude, progress=bar)
        layout = ws.build()
    except (ContextError, UsageError) as err:
        sys.stderr.write(f"codectx context: {err}\n")
        return status_for(err)
    sys.stdout.write(to_json(layout) + "\n" if args.json else render_table(layout, args.all_skipped))
    return 0


def progress_bar(stream):
    state: dict = {}

    def update(done: int, total: int) -> None:
        if total < 500:
            return
        if "bar" not in state:
            from tqdm import tqdm

            state["bar"] = tqdm(total=total, unit="file", file=stream, leave=False)
        state["bar"].n = done
        state["bar"].refresh()
        if done == total:
            state["bar"].close()

    return update


def to_json(layout: Layout) -> str:
    """The layout as a JSON document (segments without token ids)."""
    return json.dumps({
        "budget": layout.budget,
        "tokens": layout.tokens,
        "segments": [{"index": i, "kind": s.kind, "key": s.key, "tokens": len(s), "hash": s.hash,
                      "reason": s.reason} for i, s in enumerate(layout.segments)],
        "files": [r.__dict__ for r in layout.rows],
        "skipped": [{"path": s.path, "reason": s.reason} for s in layout.skipped],
        "notes": list(layout.notes),
    }, indent=1)


def render_table(layout: Layout, all_skipped: bool = False) -> str:
    """The layout as a text table with totals."""
    rows = [("#", "kind", "path", "language", "tokens", "hash", "reason")]
    by_key = {r.path: r for r in layout.rows}
    for i, s in enumerate(layout.segments):
        lang = by_key[s.key].language if s.kind in (SegmentKind.FILE, SegmentKind.HOT) and s.key in by_key else ""
        rows.append((str(i), s.kind, s.key, lang, str(len(s)), s.hash[:8], s.reason))
    rows += [("-", "", r.path, r.language, "0", r.hash, r.reason) for r in layout.rows if r.order is None]
    widths = [min(max(len(r[c]) for r in rows), 60) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if c not in (0, 4) else cell.rjust(w)
                       for c, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    whole = sum(1 for s in layout.segments if s.kind in (SegmentKind.FILE, SegmentKind.HOT))
    mapped = sum(1 for r in layout.rows if r.reason == "map-only")
    budget = "unlimited" if layout.budget is None else str(layout.budget)
    lines.append(f"\n{len(layout.segments)} segments, {layout.tokens} tokens (budget {budget}); "
                 f"{whole} files whole, {mapped} map-only, {len(layout.skipped)} skipped")
    if layout.skipped:
        counts = ", ".join(f"{k}: {v}" for k, v in iter_reasons(layout.skipped).items())
        lines.append(f"skipped by reason: {counts}")
        shown = layout.skipped if all_skipped else layout.skipped[:20]
        lines += [f"  skipped {s.path}: {s.reason}" for s in shown]
        if len(shown) < len(layout.skipped):
            lines.append(f"  ... {len(layout.skipped) - len(shown)} more (--all-skipped)")
    lines += [f"note: {n}" for n in layout.notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codectx context", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
