"""`codectx.ask`: a question about the repository, with the tool loop."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from context.focus import Focus
from context.focus_query import FocusQuery
from engine.request import PromptSegment, SamplingParams

from ..context_fit import answer_room, fitted_turns, prompt_tokens
from ..prompt import Turn, tokenizable
from ..prompt_size import PromptTooLongError, check_text_fits
from ..session import Session
from ..tools import CALL_CLOSE, ToolError, WorkspaceTools, parse_tool_call

logger = logging.getLogger(__name__)


@dataclass
class AskResult:
    """What `codectx.ask` returns. `text` equals the concatenated stream."""

    text: str
    finish_reason: str
    metrics: dict
    conversation_id: str
    tool_calls: list[dict] = field(default_factory=list)
    focus: dict | None = None  # `Focus.as_dict()`: what was focused and why (None: focus off)
    dropped_turns: int = 0  # the conversation's oldest turns that left the prompt to fit the context

    def as_dict(self) -> dict:
        return {"text": self.text, "finishReason": self.finish_reason, "metrics": self.metrics,
                "conversationId": self.conversation_id, "toolCalls": self.tool_calls, "focus": self.focus,
                "droppedTurns": self.dropped_turns}


def question_text(question: str, selection: str | None, path: str | None) -> str:
    """The user turn: the question, with the selected code when there is one."""
    if not selection:
        return question
    where = f" (from {path})" if path else ""
    return f"{question}\n\nSelected code{where}:\n```\n{selection}\n```"


async def ask(session: Session, question: str, **options: Any) -> AskResult:
    """Answers `question` (`options` as `answer`'s), counting every ask by how it ended
    (its finish reason, `cancelled` or `error`: `Counters.asks` and `Counters.outcomes`)."""
    outcome = "error"
    try:
        result = await answer(session, question, **options)
        outcome = result.finish_reason
        return result
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        session.counters.asks += 1
        session.counters.outcomes.record("ask", outcome)


async def answer(session: Session, question: str, *, on_text: Callable[[str], None],
              on_prefill: Callable[[int, int], None] | None = None, conversation_id: str | None = None,
              selection: str | None = None, path: str | None = None,
              tools: WorkspaceTools | None = None, max_tokens: int | None = None,
              sampling: SamplingParams | None = None, focus: FocusQuery | None = None,
              on_focus: Callable[[Focus], None] | None = None) -> AskResult:
    """Answers `question`, streaming every piece of text to `on_text`.

    When the model emits a tool call, the tool runs inside the workspace, its result is appended as a turn
    and generation continues (at most `settings.ask.max_tool_calls` times; not after a cancelled round).
    Tool calls are shown in the stream. `sampling` defaults to greedy. Unless `focus.enabled` is off, the
    definitions and files the request names (`focus`, default: the question and `path`) are focus segments
    after the repository prefix (`context.focus`); `on_focus` is told that focus before the answer starts.
    Prompt and answer stay inside the model's context: the conversation's oldest exchanges leave the prompt
    first, then the focus and the answer are shortened, and a tool result that cannot fit is replaced by a
    note (`server.core.context_fit`).

    Raises:
        asyncio.CancelledError: The caller cancelled; the engine request is cancelled too.
        PromptTooLongError: The question, its selection or the answer's length cannot fit in the context.
    """
    settings = session.settings.ask
    answer_tokens = max_tokens or settings.max_tokens
    asked = question_text(question, selection, path)
    await asyncio.to_thread(check_fits, session, asked, answer_tokens)  # tokenizing a long paste: not on the loop
    conversation_id, history = session.base.conversations.get(conversation_id)
    pieces: list[str] = []
    calls: list[dict] = []

    def emit(text: str) -> None:
        pieces.append(text)
        on_text(text)

    # Built on the prompt's own thread: applying edits may fold the hot tail (seconds on a large repository).
    turns, dropped, focused, segments, round_tokens = await session.prompt.call(
        _first_prompt, session, history, Turn("user", asked), focus or FocusQuery(question, path=path), answer_tokens)
    if focused is not None and on_focus is not None:
        on_focus(focused)
    metrics: dict = {}
    finish_reason = "stop"
    for round_number in range(settings.max_tool_calls + 1):
        done = await session.generate(
            segments, max_tokens=round_tokens, on_text=emit,
            stop=(CALL_CLOSE,) if tools else (), on_prefill=on_prefill, sampling=sampling)
        metrics = _add_metrics(metrics, done.metrics.as_dict())
        finish_reason = done.finish_reason
        more = tools and round_number < settings.max_tool_calls and done.finish_reason != "cancelled"
        call = _tool_call(done.text) if more else None
        if call is None:
            break
        segments, round_tokens = await _tool_round(session, tools, call, done.text, turns, focused, answer_tokens,
                                                   emit, calls)
        if not round_tokens:
            finish_reason = "length"
            break
    text = "".join(pieces)
    del history[:dropped]  # left-out turns are not kept for later asks
    history += [turns[len(history)], Turn("assistant", text)]
    return AskResult(text, finish_reason, metrics, conversation_id, calls,
                     focused.as_dict() if focused else None, dropped)


def _first_prompt(session: Session, history: list[Turn], question: Turn, query: FocusQuery, answer_tokens: int
                  ) -> tuple[list[Turn], int, Focus | None, list[PromptSegment], int]:
    """The first round's turns (how many of `history` were left out), focus, prompt and answer's
    tokens: the oldest exchanges give way to the answer and the focus the question gets (within
    its budget); the focus shrinks only where no history is left to give way."""
    settings, context_length = session.settings.focus, session.backend.context_length
    focused = session.prompt.focus(query, settings.budget_tokens) if settings.enabled else None
    turns, dropped, room = fitted_turns(session.prompt, history, question, context_length, answer_tokens,
                                        focused.tokens if focused else 0)
    if dropped:
        logger.info("a conversation's %d oldest turns left the prompt to fit the model's context", dropped)
    segments = session.prompt.segments(turns, focused.segments if focused else ())
    if focused is not None and prompt_tokens(segments) + room > context_length:
        focused = focus_of(session, query, turns, room)
        segments = session.prompt.segments(turns, focused.segments if focused else ())
    return turns, dropped, focused, segments, room


async def _tool_round(session: Session, tools: WorkspaceTools, call: Any, text: str, turns: list[Turn],
                      focused: Focus | None, answer_tokens: int, emit: Callable[[str], None],
                      calls: list[dict]) -> tuple[list[PromptSegment], int]:
    """Runs `call` (the round's `text` asked for it), adds the exchange to `turns` and returns the
    next round's prompt and answer's tokens; 0 tokens (said in the stream): no room for a round."""
    result = await asyncio.to_thread(_run_tool, tools, call)  # reads files (a search reads every one)
    calls.append({"name": call.name, "arguments": call.arguments, "resultChars": len(result)})
    emit(f"\n[tool {call.name} returned {len(result)} characters]\n")
    reply = text if text.rstrip().endswith(CALL_CLOSE) else text + CALL_CLOSE
    turns += [Turn("assistant", reply), Turn("user", f"<tool_response>\n{result}\n</tool_response>")]
    segments, room = await session.prompt.call(_tool_round_prompt, session, turns, focused, answer_tokens)
    if not room:
        emit("\n[no room left in the model's context for another round]\n")
    return segments, room


def _tool_round_prompt(session: Session, turns: list[Turn], focused: Focus | None,
                       answer_tokens: int) -> tuple[list[PromptSegment], int]:
    """The next tool round's prompt and answer's tokens (`answer_room`); a tool result that leaves
    too little room is replaced by a note saying so (the model answers without it)."""
    focus_segments = focused.segments if focused else ()
    context_length = session.backend.context_length
    segments = session.prompt.segments(turns, focus_segments)
    room = answer_room(segments, context_length, answer_tokens)
    if room:
        return segments, room
    turns[-1] = Turn("user", "<tool_response>\nerror: the result does not fit in the model's context\n</tool_response>")
    segments = session.prompt.segments(turns, focus_segments)
    return segments, answer_room(segments, context_length, answer_tokens)


def check_fits(session: Session, asked: str, answer_tokens: int) -> None:
    """`question_fits` with the session's backend."""
    question_fits(session.backend.tokenizer, session.backend.context_length, asked, answer_tokens)


def question_fits(tokenizer: Any, context: int, asked: str, answer_tokens: int) -> None:
    """Refuse a question (with its selection) or an answer's length that cannot fit in a model's context of
    `context` tokens, whatever the repository prefix: by characters first, so that a huge paste is never tokenized.

    Raises:
        PromptTooLongError: Says which, and the context's size.
    """
    if answer_tokens >= context:
        raise PromptTooLongError(f"maxTokens {answer_tokens} leaves no room for the prompt in the model's context "
                                 f"of {context} tokens")
    room = context - answer_tokens
    check_text_fits(tokenizer, [asked], room, "the question and its selection")
    tokens = len(tokenizer.encode(tokenizable(asked)))
    if tokens > room:
        raise PromptTooLongError(f"the question and its selection are {tokens} tokens; with an answer of "
                                 f"{answer_tokens} the model's context of {context} tokens has room for {room}")


def focus_of(session: Session, query: FocusQuery, turns: list[Turn], answer_tokens: int) -> Focus | None:
    """The focus of a request under the session's `focus.*` settings (None when off), within
    what the model's context leaves after the prompt without it and the answer."""
    return session.prompt.fitted_focus(query, turns, session.settings.focus, session.backend.context_length,
                                       answer_tokens)


def _tool_call(text: str):
    try:
        return parse_tool_call(text)
    except ToolError as err:
        logger.info("ignoring malformed tool call: %s", err)
        return None


def _run_tool(tools: WorkspaceTools, call) -> str:
    try:
        return tools.run(call)
    except ToolError as err:
        return f"error: {err}"


def _add_metrics(total: dict, new: dict) -> dict:
    """Sums the counters of several engine rounds; keeps the first round's TTFT."""
    if not total:
        return dict(new, rounds=1)
    summed = dict(total, rounds=total["rounds"] + 1)
    for key in ("prompt_tokens", "cached_tokens", "recomputed_tokens", "prefill_s", "decode_tokens",
                "decode_s", "drafted_tokens", "accepted_tokens"):
        summed[key] = total.get(key, 0) + new.get(key, 0)
    summed["prefill_tps"] = summed["recomputed_tokens"] / summed["prefill_s"] if summed["prefill_s"] else 0.0
    summed["decode_tps"] = summed["decode_tokens"] / summed["decode_s"] if summed["decode_s"] else 0.0
    summed["acceptance"] = summed["accepted_tokens"] / summed["drafted_tokens"] if summed["drafted_tokens"] else 0.0
    summed["checkpoint_bytes"] = new.get("checkpoint_bytes", 0)
    summed["loop_period"], summed["loop_tokens"] = new.get("loop_period", 0), new.get("loop_tokens", 0)  # the last round's
    return summed
