"""Hover: a short model explanation of the symbol under the cursor.

Answers are cached by (definition hash, dependencies hash): the xxh3 of the
symbol's own text and the xxh3 over the definitions its text refers to. A new
answer is generated only when one of those changed; edits elsewhere, even in
the same file, keep the cached answer.
When the model cannot answer within the latency budget, the signature and
docstring are returned at once and the answer lands in the cache for the
next hover.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..prompt import Turn
from ..session import Session
from .symbols import DefinitionIndex, DefinitionSite

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HoverAnswer:
    """Markdown for the hover and where it came from ("model", "cache" or "signature")."""

    markdown: str
    source: str


class HoverCache:
    """Model answers by (definition hash, dependencies hash), plus generations in flight.

    Args:
        read_text: A file's current text (open buffer or disk), for the definition index.
    """

    def __init__(self, read_text) -> None:
        self.index = DefinitionIndex(read_text)
        self.answers: dict[tuple[str, str], str] = {}
        self.pending: dict[tuple[str, str], asyncio.Task] = {}

    def key(self, site: DefinitionSite, files: list[Path]) -> tuple[str, str]:
        """What an answer about `site` depends on."""
        return site.key, self.index.dependencies_hash(site, files)


def render(site: DefinitionSite, explanation: str | None) -> str:
    """The hover markdown: explanation (if any), then signature and docstring."""
    definition = site.definition
    parts = [f"**{definition.name}** ({definition.kind}, `{site.path.name}:{definition.line}`)"]
    if explanation:
        parts.append(explanation.strip())
    parts.append(f"```\n{definition.signature}\n```")
    if site.docstring and not explanation:
        parts.append(site.docstring)
    return "\n\n".join(parts)


def hover_question(site: DefinitionSite) -> str:
    return (f"In one or two sentences, explain `{site.definition.name}` "
            f"({site.path.name}:{site.definition.line}):\n```\n{site.snippet}\n```")


async def explain(session: Session, cache: HoverCache, name: str, current: Path,
                  files: list[Path]) -> HoverAnswer | None:
    """The hover answer for `name`, or None when no definition is found.

    Raises:
        NotReadyError: The model is still loading.
    """
    started = time.perf_counter()
    site = cache.index.find(name, current, files)
    if site is None:
        return None
    session.counters.hovers += 1
    key = cache.key(site, files)
    if key in cache.answers:
        session.counters.hover_cache_hits += 1
        return HoverAnswer(render(site, cache.answers[key]), "cache")
    task = cache.pending.get(key)
    if task is None:
        task = asyncio.ensure_future(_generate(session, site, started))
        cache.pending[key] = task
        task.add_done_callback(lambda t: _store(cache, key, t))
    budget = session.settings.hover.latency_budget_ms / 1000
    try:
        text = await asyncio.wait_for(asyncio.shield(task), budget) if budget > 0 else None
    except asyncio.TimeoutError:
        text = None
    if text is None:
        return HoverAnswer(render(site, None), "signature")
    return HoverAnswer(render(site, text), "model")


async def _generate(session: Session, site: DefinitionSite, started: float) -> str:
    """The model's explanation; records the hover's timings in `session.counters.last_hover`."""
    segments = session.prompt.segments([Turn("user", hover_question(site))])
    if session.settings.hover.use_warm_prefix:
        segments = session.on_warm_prefix(segments)
    first_token: list[float] = []

    def on_text(_text: str) -> None:
        if not first_token:
            first_token.append(time.perf_counter() - started)

    done = await session.generate(segments, max_tokens=session.settings.hover.max_tokens, on_text=on_text)
    session.counters.last_hover = {"firstTokenS": first_token[0] if first_token else None,
                                   "totalS": time.perf_counter() - started,
                                   "promptTokens": sum(len(s.token_ids) for s in segments)}
    return done.text


def _store(cache: HoverCache, key: tuple[str, str], task: asyncio.Task) -> None:
    cache.pending.pop(key, None)
    if task.cancelled() or task.exception() is not None:
        return
    cache.answers[key] = task.result()
