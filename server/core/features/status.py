"""`codectx.status` and `codectx.showContext`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from context.scan import Skipped, iter_reasons

from ..session import LoadingSession, Session

if TYPE_CHECKING:  # the ready session holds the features; status only reads it
    from ..ready import ReadySession


def status(base: LoadingSession, ready: ReadySession | None, position_encoding: str, transport: dict,
           load_error: str | None = None) -> dict:
    """Readiness, warmth, counters and the server's own bookkeeping sizes (answered in both phases).

    Args:
        base: The session's loading phase (settings, buffers, counters).
        ready: The ready session, or None while loading (or after loading failed).
        position_encoding: The position encoding agreed with the client.
        transport: The transport's own bookkeeping sizes (pending requests, ...).
        load_error: Why loading failed, as the user is told; None while loading or once loaded.
    """
    counters = base.counters
    return {
        "ready": ready is not None,
        "loadError": load_error,
        "model": ready.model_id if ready is not None else None,
        "positionEncoding": position_encoding,
        "prefixVersion": base.prefix_version,
        "warmup": ready.warmup.state() if ready is not None else None,
        "counters": {"asks": counters.asks, "hovers": counters.hovers,
                     "hoverCacheHits": counters.hover_cache_hits, "cancelled": counters.cancelled,
                     "warmups": counters.warmups, "outcomes": counters.outcomes.snapshot()},
        "lastMetrics": counters.last_metrics or None,  # null until a request has finished
        "lastHover": counters.last_hover,
        "engine": ready.backend.stats() if ready is not None else None,
        "server": dict(transport, openDocuments=len(base.documents)),
        "hoverPrefetch": ready.prefetch.state() if ready is not None else None,
    }


def show_context(session: Session, layout: list[dict], cache_states: list[str], focus=None) -> dict:
    """The prefix layout as rows and as a markdown document for a virtual buffer, with the
    files the access policy left out (and why), the layout's notes and, for a question, its
    focus (what an ask would add after the prefix, and why).

    Args:
        session: A ready session.
        layout: The prefix's rows (`WorkspacePrompt.layout`).
        cache_states: "cached", "partial" or "cold" per prefix segment (`Warmup.segment_states`).
        focus: A `context.focus.Focus` to show, or None.
    """
    rows = [dict(row, cache=state) for row, state in zip(layout, cache_states)]
    lines = ["# codectx context", "", "| # | kind | key | tokens | cache |", "|---|---|---|---|---|"]
    lines += [f"| {i} | {r['kind']} | {r['key']} | {r['tokens']} | {r['cache']} |" for i, r in enumerate(rows)]
    cached = sum(r["tokens"] for r in rows if r["cache"] == "cached")
    lines += ["", f"total: {sum(r['tokens'] for r in rows)} tokens in {len(rows)} segments; "
              f"{cached} tokens cached", budget_line(session)]
    skipped, notes = session.prompt.skipped(), session.prompt.notes()
    if skipped:
        counts = iter_reasons(Skipped(s["path"], s["reason"]) for s in skipped)
        lines.append(f"skipped: {len(skipped)} ({', '.join(f'{k}: {v}' for k, v in counts.items())})")
    lines += [f"note: {note}" for note in notes]
    if focus is not None:
        lines += ["", "## focus", "", *(f"    {line}" for line in focus.lines())]
    return {"segments": rows, "skipped": skipped, "notes": notes, "markdown": "\n".join(lines) + "\n",
            "focus": focus.as_dict() if focus is not None else None, "budget": session.prompt.workspace.budget}


def budget_line(session: Session) -> str:
    """The prefix's token budget, and why when the server lowered `context.budgetTokens` (`server_context`)."""
    budget, setting = session.prompt.workspace.budget, session.settings.context.budget_tokens
    if budget is None or budget >= setting:
        return f"budget: {budget if budget is not None else 'unlimited'} tokens"
    return (f"budget: {budget} tokens (context.budgetTokens {setting}, lowered to leave an ask room in the model's "
            f"context of {session.backend.context_length} tokens)")
