"""`codectx context`: show the prefix layout codectx builds for a repository.

A table of order, path, language, tokens, hash prefix and reason (pinned,
dependency order / rank, hot, map-only, omitted), totals (how many files fit whole,
as map entries only, or not at all), and the files the scan skipped with their
reasons. `--json` prints the same as one JSON object.

Without `--budget` the layout is the one `codectx ask` builds: its budget is the
`context.budgetTokens` setting within what the model's context leaves for the
answer (`--max-tokens`, as `ask`'s) and the template (`server.core.prefix_budget`);
`--budget unlimited` shows every file whole.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from context.errors import ContextError
from context.layout import Layout
from context.scan import ScanProgress, iter_reasons
from engine.request import SegmentKind
from server.core.prefix_budget import ASK_MAX_TOKENS
from server.exit_status import UsageError, check_folder, status_for

UNLIMITED = "unlimited"


def _budget(value: str) -> int | str:
    if value == UNLIMITED:
        return UNLIMITED
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of tokens or '{UNLIMITED}', got {value!r}")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `context`'s options to a (sub)parser."""
    parser.add_argument("--repo", default=".", help="workspace folder (default: current folder)")
    parser.add_argument("--budget", type=_budget, default=None, metavar="N|unlimited",
                        help="token budget (default: the one `codectx ask` uses for the model)")
    parser.add_argument("--model", help="model folder whose context sizes the default budget "
                                        "(default: the --tokenizer folder when it holds a model, else the "
                                        "default model)")
    parser.add_argument("--max-tokens", type=int, default=ASK_MAX_TOKENS,
                        help=f"answer tokens the default budget leaves room for (default {ASK_MAX_TOKENS}, as ask)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--tokenizer", help="folder with tokenizer.json (default: the default model's)")
    parser.add_argument("--include", action="append", default=[], metavar="GLOB", help="only these files")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave these out")
    parser.add_argument("--pin", action="append", default=None, metavar="GLOB", help="always first")
    parser.add_argument("--all-skipped", action="store_true", help="list every skipped file")
    parser.add_argument("--question", help="also show the focus an ask with this question gets: the "
                                           "definitions and files it names, why, and their tokens")


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
        budget, why = resolve_budget(args)
        bar = progress_bar(sys.stderr)
        ws = Workspace(root, tokenizer, budget=budget, pins=args.pin or DEFAULT_PINS,
                       include=args.include, exclude=args.exclude, progress=bar)
        layout = ws.build()
    except (ContextError, UsageError) as err:
        sys.stderr.write(f"codectx context: {err}\n")
        return status_for(err)
    focus = focus_of(ws, args.question) if args.question else None
    if args.json:
        sys.stdout.write(to_json(layout, why) if focus is None else
                         json.dumps(dict(json.loads(to_json(layout, why)), focus=focus.as_dict()), indent=1))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_table(layout, args.all_skipped, why))
        sys.stdout.write("" if focus is None else "\n".join(focus.lines()) + "\n")
    return 0


def resolve_budget(args: argparse.Namespace) -> tuple[int | None, str]:
    """The layout's budget (None: unlimited) and where it comes from, in words.

    Raises:
        UsageError: `--model` is not a model folder, or `--max-tokens` is below 1.
    """
    from server.core.prefix_budget import prefix_budget
    from server.core.settings import Settings

    if args.budget == UNLIMITED:
        return None, "--budget unlimited: every file whole"
    if args.budget is not None:
        return args.budget, "--budget"
    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be >= 1")
    context = Settings().context
    folder = _model_folder(args)
    if folder is None:
        return context.budget_tokens, "the context.budgetTokens setting (no model config to size it by)"
    from engine.loaded_model import context_length_of

    try:
        length = context_length_of(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError) as err:  # unreadable, not JSON, not an object
        raise UsageError(f"{folder / 'config.json'} is not a model config: {err}") from err
    budget = prefix_budget(context, length, args.max_tokens)
    return budget, (f"what `codectx ask` uses for {folder.name}: context.budgetTokens {context.budget_tokens} "
                    f"within its {length}-token context less {args.max_tokens} answer tokens; "
                    f"`--budget unlimited` shows every file whole")


def _model_folder(args: argparse.Namespace) -> Path | None:
    """The model folder whose config sizes the default budget, or None without one."""
    if args.model:
        folder = Path(args.model)
        if not (folder / "config.json").is_file():
            raise UsageError(f"--model {folder}: not a model folder (no config.json); pass --budget N instead")
        return folder
    if args.tokenizer:
        folder = Path(args.tokenizer)
        return folder if (folder / "config.json").is_file() else None
    from engine.default_model import cached_default_model

    model = cached_default_model()
    return model.directory if model is not None else None


def focus_of(ws, question: str):
    """The focus an ask with `question` gets (`context.focus`), within the `focus.budgetTokens` setting."""
    from context.focus import select_focus
    from context.focus_query import FocusQuery
    from server.core.settings import Settings

    return select_focus(ws.files, FocusQuery(question), ws.tokens, Settings().focus.budget_tokens)


def progress_bar(stream) -> ScanProgress:
    """A scan's progress on `stream`: a bar for each stage that runs over half a second."""
    bars: dict = {}

    def update(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            from tqdm import tqdm

            bar = bars[stage] = tqdm(total=total, desc=stage, unit="file", file=stream, leave=False, delay=0.5)
        bar.update(done - bar.n)
        if done == total:
            bar.close()

    return update


def fit_counts(layout: Layout) -> dict[str, int]:
    """How many kept files fit whole, as map entries only, and not at all."""
    reasons = [r.reason for r in layout.left_out]
    return {"whole": sum(1 for s in layout.segments if s.kind in (SegmentKind.FILE, SegmentKind.HOT)),
            "mapOnly": reasons.count("map-only"), "notAtAll": len(reasons) - reasons.count("map-only")}


def fit_summary(layout: Layout) -> str:
    """The counts of `fit_counts` in words."""
    counts = fit_counts(layout)
    return (f"{counts['whole']} files whole, {counts['mapOnly']} map-only (signatures), "
            f"{counts['notAtAll']} not at all (over budget)")


def to_json(layout: Layout, budget_source: str = "") -> str:
    """The layout as a JSON document (segments without token ids)."""
    return json.dumps({
        "budget": layout.budget,
        "budgetSource": budget_source,
        "fit": fit_counts(layout),
        "tokens": layout.tokens,
        "segments": [{"index": i, "kind": s.kind, "key": s.key, "tokens": len(s), "hash": s.hash,
                      "reason": s.reason} for i, s in enumerate(layout.segments)],
        "files": [r.__dict__ for r in layout.rows],
        "skipped": [{"path": s.path, "reason": s.reason} for s in layout.skipped],
        "notes": list(layout.notes),
    }, indent=1)


def render_table(layout: Layout, all_skipped: bool = False, budget_source: str = "") -> str:
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
    budget = "unlimited" if layout.budget is None else str(layout.budget)
    lines.append(f"\n{len(layout.segments)} segments, {layout.tokens} tokens (budget {budget}); "
                 f"{fit_summary(layout)}; {len(layout.skipped)} skipped")
    if budget_source:
        lines.append(f"budget: {budget_source}")
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
