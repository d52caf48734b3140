"""Hover: a short model explanation of the symbol under the cursor.

Answers are cached by (definition hash, dependencies hash): the xxh3 of the
symbol's own text and the xxh3 over the definitions its text refers to. A new
answer is generated only when one of those changed; edits elsewhere, even in
the same file, keep the cached answer.
A hover returns at once (or within `hover.latencyBudgetMs`, 0 by default) with
the static card: location, signature and docstring, plus a visible "explanation
pending" line while the model's answer is still being generated; the answer
lands in the cache and the next hover on the symbol shows it.

The prompt is built for a fast first token: the stable prefix, a hover turn
that names no symbol and the answer header form a *lead-in* shared by every
hover (warm-up prefills it, see `server.core.warmup`); the model's answer is
then started with the symbol's name ("`name` is"), so a hover computes only
those few tokens before its first generated one.

The layout is always `[lead-in][head][tail]`: the head (the signatures of what the
definition uses, its text under its place, then "`name`": the answer is grounded in the
code it explains) is a segment of its own, so its end is a checkpoint that hover preparation prefills ahead
(`hover_prefetch`) and a later hover restores; the tail (" is") is computed.
Whether the head was prepared changes what is restored, never the tokens or
the forward calls that follow (warm == cold).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from context.lru import LRUDict

from engine.request import DoneEvent, Priority, PromptSegment, Request, SegmentKind

from ..prompt import Turn
from ..session import Session
from .symbols import DefinitionIndex, DefinitionSite, ReferenceCount

logger = logging.getLogger(__name__)
MAX_ANSWERS = 4096


@dataclass(frozen=True)
class HoverAnswer:
    """Markdown for the hover and where it came from ("model", "cache" or "signature")."""

    markdown: str
    source: str


class HoverCache:
    """Model answers by (definition hash, dependencies hash), plus generations in flight.

    Args:
        read_text: A file's current text (open buffer or disk), for the definition index.
        tags: The workspace's tag cache (`context.definitions.DefinitionIndex`), or None.
    """

    def __init__(self, read_text, tags=None) -> None:
        self.index = DefinitionIndex(read_text, tags)
        # Bounded: every edit of a definition or of what it uses makes a new key.
        self.answers: LRUDict[tuple[str, str], str] = LRUDict(MAX_ANSWERS)
        self.pending: dict[tuple[str, str], asyncio.Task] = {}

    def key(self, site: DefinitionSite, files: list[Path]) -> tuple[str, str]:
        """What an answer about `site` depends on."""
        return site.key, self.index.dependencies_hash(site, files)

    def answer(self, key: tuple[str, str]) -> str | None:
        """The answer stored under `key`, or that of its generation if it has finished and its done callback
        (`_store`, run on a later turn of the event loop) has not stored it yet; None: none."""
        if key in self.answers:
            return self.answers[key]
        return finished(self.pending.get(key))


def finished(task: asyncio.Task | None) -> str | None:
    """The answer of a generation that has ended without error, else None (running, cancelled or failed)."""
    if task is None or not task.done() or task.cancelled() or task.exception() is not None:
        return None
    return task.result()


PENDING_LINE = "*codectx: explanation pending; hover again in a moment.*"
LOADING_LINE = "*codectx: the model is loading; explanations follow.*"
NOT_LOADED_LINE = "*codectx: the model did not load, so there is no explanation; `codectx.status` says why.*"


def render(site: DefinitionSite, explanation: str | None, pending: bool = False, note: str = PENDING_LINE,
           count_references: bool = True) -> str:
    """The hover markdown: explanation (if any), then signature and docstring, then how many
    of the files searched refer to the name (files, not occurrences: see
    `DefinitionIndex.references_count`); without an explanation, the static card, with `note`
    while the model's answer is coming."""
    definition = site.definition
    parts = [f"**{definition.name}** ({definition.kind}, `{site.path.name}:{definition.line}`)"]
    if explanation:
        parts.append(explanation.strip())
    parts.append(f"```\n{definition.signature}\n```")
    if site.docstring and not explanation:
        parts.append(site.docstring)
    count = site.reference_count if count_references else None
    if count is not None:
        parts.append(references_line(count))
    if pending and not explanation:
        parts.append(note)
    return "\n\n".join(parts)


def references_line(count: ReferenceCount) -> str:
    """The card's references line, e.g. "Referenced in 2 of 14 files in context."."""
    return f"Referenced in {count.files} of {count.searched} file{'' if count.searched == 1 else 's'} in context."


HOVER_INSTRUCTION = ("Explain one symbol of this repository, named at the start of your answer, "
                     "in {length}: what it does and how the code uses it.")
"""The hover's user turn. It names no symbol, so the prompt up to the answer
header is the same for every hover (the *lead-in*): warm-up prefills it and
a hover computes only the few tokens of `answer_start`."""
SENTENCE_ENDS = (". ", ".\n")
"""Stop strings that end the first sentence (`hover.firstSentence`); the period is put back."""


def instruction(session: Session) -> str:
    """The hover turn's text, asking for one sentence when only the first is kept."""
    one = session.settings.hover.first_sentence
    return HOVER_INSTRUCTION.format(length="one sentence" if one else "one or two sentences")


def lead_in(session: Session) -> list[PromptSegment]:
    """The stable prefix + the hover turn + the answer header (what warm-up prefills for hovers).
    It applies the edits made since the last prompt (a fold takes seconds): off the event loop, see `current_lead_in`."""
    return session.prompt.segments([Turn("user", instruction(session))])


async def current_lead_in(session: Session) -> list[PromptSegment]:
    """`lead_in`, built on the prompt's own thread (`WorkspacePrompt.call`)."""
    return await session.prompt.call(lead_in, session)


HOVER_DEFINITION_TOKENS = 80
"""How much of the definition's text a hover quotes (whole lines, from its first): the
signature, the docstring's start and the first lines. The head's prefill is half a
prepared answer's cost on a CPU (`python bench/hover_batch.py`: a batch of 4, 2.6 s of 5.0 s;
with 128 + 48 tokens and batches of 8, prepared answers fell behind a reader,
`bench/lsp_reading.py`)."""

HOVER_CALLEE_TOKENS = 32
"""How much the signatures of what the definition uses take in a hover's head (whole
signatures, first named first; the "Uses:" fence around them adds a few tokens)."""


def answer_start(session: Session, site: DefinitionSite) -> tuple[str, str]:
    """The start of the model's answer as (head, tail). The head grounds the answer: the
    signatures of the definitions its text uses (`uses`), then the definition's current
    text (its first `HOVER_DEFINITION_TOKENS` tokens, whole lines) under its place, then the
    symbol's name; the tail is " is", which the model continues.
    Quoting the text right before the answer holds whether or not the file fits the
    prefix, and whether or not the prefix the model read predates an edit. The head depends
    only on the current texts, so the same inputs give the same tokens (warm == cold)."""
    name = site.definition.name
    try:
        where = site.path.relative_to(session.root).as_posix()
    except ValueError:
        where = site.path.name
    encode = session.tokenizer.encode
    text = _clipped(site.snippet, encode, HOVER_DEFINITION_TOKENS)
    quote = f"`{name}` ({where}, line {site.definition.line}):\n```\n{text}\n```\n`{name}`"
    used = uses(session, site)
    # Before the quote: `_explanation` cuts the answer after the quote's closing fence.
    return (f"Uses:\n```\n{used}\n```\n{quote}" if used else quote), " is"


def uses(session: Session, site: DefinitionSite) -> str:
    """One signature a line of the definitions `site`'s text uses (`DefinitionIndex.uses` over
    the prompt's files: first named first, itself and names not found left out), as many as
    fit `HOVER_CALLEE_TOKENS`; empty without any, or for a session without a hover index."""
    cache = getattr(session, "hover_cache", None)  # a ReadySession's: the one definition index
    if cache is None:
        return ""
    encode = session.tokenizer.encode
    kept: list[str] = []
    for used in cache.index.uses(site, session.prompt.files):
        if len(encode("\n".join([*kept, used.definition.signature]))) > HOVER_CALLEE_TOKENS:
            break
        kept.append(used.definition.signature)
    return "\n".join(kept)


def _clipped(text: str, encode, max_tokens: int) -> str:
    """`text`'s leading whole lines that fit `max_tokens` (at least its first line)."""
    if len(encode(text)) <= max_tokens:
        return text
    lines = text.splitlines()
    kept: list[str] = []
    for line in lines:
        if kept and len(encode("\n".join([*kept, line, "..."]))) > max_tokens:
            break
        kept.append(line)
    return "\n".join([*kept, "..."])


def hover_segments(session: Session, site: DefinitionSite, current: list[PromptSegment]
                   ) -> tuple[list[PromptSegment], str]:
    """`[lead-in][head][tail]` for `site` over the lead-in `current` (`lead_in`; put on the warm prefix when
    allowed), and the answer start's text (head + tail)."""
    lead = session.on_warm_prefix(current) if session.settings.hover.use_warm_prefix else current
    head, tail = answer_start(session, site)
    encode = session.tokenizer.encode
    return [*lead, PromptSegment(SegmentKind.ANSWER, "hover", tuple(encode(head))),
            PromptSegment(SegmentKind.ANSWER, "hover-tail", tuple(encode(tail)))], head + tail


def head_segments(session: Session, site: DefinitionSite, lead: list[PromptSegment]) -> list[PromptSegment]:
    """`[lead-in][head]` of `site` over the lead-in `lead` (`lead_in`): what preparation prefills so that a
    hover restores the head."""
    head, _ = answer_start(session, site)
    return [*lead, PromptSegment(SegmentKind.ANSWER, "hover", tuple(session.tokenizer.encode(head)))]


def static_card(index: DefinitionIndex, name: str, current: Path, files: list[Path],
                note: str = LOADING_LINE) -> HoverAnswer | None:
    """The card a hover shows without the model (`note` says why), or None when no
    definition of `name` is found in `current` or `files`. It has no references line: the
    workspace is not scanned yet, and a count over the few files searched would read as the
    workspace's."""
    site = index.find(name, current, files)
    if site is None:
        return None
    return HoverAnswer(render(site, None, pending=True, note=note, count_references=False), "signature")


async def explain(session: Session, cache: HoverCache, name: str, current: Path,
                  files: list[Path], line: int | None = None) -> HoverAnswer | None:
    """The hover answer for `name` hovered at 1-based `line` of `current`, or None when no
    definition is found."""
    started = time.perf_counter()
    site = cache.index.find(name, current, files, line)
    if site is None:
        return None
    session.counters.hovers += 1
    key = cache.key(site, files)
    known = cache.answer(key)
    if known is not None:
        session.counters.hover_cache_hits += 1
        return HoverAnswer(render(site, known), "cache")
    task = cache.pending.get(key)
    if task is None and _left_to_preparation(session):
        return HoverAnswer(render(site, None, pending=True), "signature")
    task = task or start(session, cache, site, key, started)
    budget = session.settings.hover.latency_budget_ms / 1000
    try:
        text = await asyncio.wait_for(asyncio.shield(task), budget) if budget > 0 else None
    except asyncio.TimeoutError:
        text = None
    except asyncio.CancelledError:
        if not (task.cancelled() and not asyncio.current_task().cancelling()):
            raise
        text = None  # a background preparation of this answer was interrupted, not this hover
    if text is None:
        text = finished(task)  # finished as the wait ran out, not stored in the cache yet
    if text is None:
        # Pending unless it failed: a cancelled preparation is generated again on the next hover.
        failed = task.done() and not task.cancelled() and task.exception() is not None
        return HoverAnswer(render(site, None, pending=not failed), "signature")
    return HoverAnswer(render(site, text), "model")


def _left_to_preparation(session: Session) -> bool:
    """True when a hover without an answer should leave it to hover preparation: the hover
    returns the card at once anyway (`hover.latencyBudgetMs` 0) and a preparation pass is
    running. The hover moves preparation's focus to its definition (`ReadySession.focus`), so
    the next batch starts with it; starting an interactive generation instead would preempt
    the batch in flight and throw its work away, and a reader ahead of preparation would then
    turn every batch into lost work (`bench/lsp_reading.py`)."""
    prefetch = getattr(session, "prefetch", None)  # a ReadySession's `HoverPrefetch`
    return session.settings.hover.latency_budget_ms == 0 and prefetch is not None and prefetch.running


def start(session: Session, cache: HoverCache, site: DefinitionSite, key: tuple[str, str], started: float,
          priority: Priority = Priority.INTERACTIVE, lead: list[PromptSegment] | None = None) -> asyncio.Task:
    """Starts generating the answer for `site` (over `lead`, or the lead-in built now); it lands in
    `cache.answers` under `key`."""
    return track(cache, key, asyncio.ensure_future(_generate(session, cache, site, started, priority, lead)))


def start_batch(session: Session, cache: HoverCache, sites: list[DefinitionSite], keys: list[tuple[str, str]],
                lead: list[PromptSegment], priority: Priority = Priority.PREPARE) -> list[asyncio.Task]:
    """Starts generating the answers for `sites` over the lead-in `lead` (`lead_in`) together (`Backend.generate_batch`: one batch over
    their common lead-in where the engine can); each lands in `cache.answers` under its key as soon
    as it ends, exactly what `start` would have stored."""
    prompts = [answer_request(session, site, lead) for site in sites]
    max_tokens = session.settings.hover.max_tokens
    waits = session.backend.generate_batch([Request(segments=segments, max_tokens=max_tokens, stop=stop,
                                                    priority=priority) for segments, _, stop in prompts])
    return [track(cache, key, asyncio.ensure_future(_answer_of(session, wait, start_text)))
            for key, wait, (_, start_text, _) in zip(keys, waits, prompts)]


async def _answer_of(session: Session, wait, start_text: str) -> str:
    done = await wait
    if done.finish_reason == "error" and done.error is not None:
        raise done.error
    return answer_text(session, start_text, done)


def track(cache: HoverCache, key: tuple[str, str], task: asyncio.Task) -> asyncio.Task:
    """Makes `task` (an answer being generated) pending under `key`; its answer lands in `cache.answers`."""
    cache.pending[key] = task
    task.add_done_callback(lambda t: _store(cache, key, t))
    return task


def answer_request(session: Session, site: DefinitionSite, lead: list[PromptSegment]
                   ) -> tuple[list[PromptSegment], str, tuple[str, ...]]:
    """`site`'s answer prompt over the lead-in `lead` (`hover_segments`), the answer start's text and the stop
    strings."""
    segments, start_text = hover_segments(session, site, lead)
    stop = ("\n\n", *SENTENCE_ENDS) if session.settings.hover.first_sentence else ("\n\n",)
    return segments, start_text, stop


def answer_text(session: Session, start_text: str, done: DoneEvent) -> str:
    """The answer as stored and shown, from a finished generation (`_explanation`).

    Raises:
        asyncio.CancelledError: The generation was cancelled (it is generated again later).
    """
    if done.finish_reason == "cancelled":
        raise asyncio.CancelledError()
    sentence = session.settings.hover.first_sentence and done.finish_reason == "stop"
    return _explanation(start_text, done.text, sentence)


async def _generate(session: Session, cache: HoverCache, site: DefinitionSite, started: float,
                    priority: Priority = Priority.INTERACTIVE, lead: list[PromptSegment] | None = None) -> str:
    """The model's explanation; an interactive one records its timings in `session.counters.last_hover`."""
    lead = lead if lead is not None else await current_lead_in(session)
    segments, start_text, stop = answer_request(session, site, lead)
    first_token: list[float] = []

    def on_text(_text: str) -> None:
        if not first_token:
            first_token.append(time.perf_counter() - started)

    done = await session.generate(segments, max_tokens=session.settings.hover.max_tokens, on_text=on_text,
                                  stop=stop, priority=priority)
    text = answer_text(session, start_text, done)
    if priority != Priority.INTERACTIVE:
        return text
    prompt_tokens = sum(len(s.token_ids) for s in segments)
    head_end = prompt_tokens - len(segments[-1].token_ids)
    session.counters.last_hover = {"firstTokenS": first_token[0] if first_token else None,
                                   "totalS": time.perf_counter() - started,
                                   "promptTokens": prompt_tokens,
                                   "cachedTokens": done.metrics.cached_tokens,
                                   "recomputedTokens": done.metrics.recomputed_tokens,
                                   "headTokens": len(segments[-2].token_ids),  # the quoted definition + name
                                   # the head was restored (prepared, or left by an earlier hover)
                                   "startPrepared": done.metrics.cached_tokens == head_end}
    return text


def _explanation(start: str, generated: str, sentence: bool = False) -> str:
    """The answer as the user reads it: the name sentence, without the quoted definition (with
    its period put back when `sentence`: a stop at the sentence's end cuts it)."""
    text = (start[start.rindex("```") + 3:].lstrip("\n") + generated).rstrip()
    return text + "." if sentence and not text.endswith((".", ":", "!", "?")) else text


def _store(cache: HoverCache, key: tuple[str, str], task: asyncio.Task) -> None:
    cache.pending.pop(key, None)
    if task.cancelled() or task.exception() is not None:
        return
    cache.answers[key] = task.result()
