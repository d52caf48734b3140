"""Keeping a request inside the model's context. For an ask (`features.ask`): a conversation's
oldest exchanges leave the prompt first, then the focus and then the answer are shortened to the
room left, a tool result that cannot fit is replaced by a note, and a question that leaves too
little room even alone is refused; code actions shorten their answer or refuse the same way.

Neither prompt nor answer runs past the model's trained context, where the model would answer from
positions it never learned. The engine refuses such a request (`ContextOverflowError`); fitting it here
lets a long conversation or a long answer go on, shortened, instead of failing.
"""
from __future__ import annotations

from typing import Any, Sequence

from engine.request import PromptSegment

from .prompt import Turn
from .prompt_size import PromptTooLongError

MIN_ANSWER_TOKENS = 32
"""An answer shortened to fit the context keeps at least this many tokens (or its `maxTokens`, if fewer)."""


def prompt_tokens(segments: Sequence[PromptSegment]) -> int:
    return sum(len(segment.token_ids) for segment in segments)


def answer_room(segments: Sequence[PromptSegment], context_length: int, answer_tokens: int) -> int:
    """The tokens an answer after a prompt of `segments` may have: `answer_tokens`, or what the
    context leaves; 0 when that is under `MIN_ANSWER_TOKENS` (or `answer_tokens`, if fewer)."""
    room = min(answer_tokens, context_length - prompt_tokens(segments))
    return room if room >= min(answer_tokens, MIN_ANSWER_TOKENS) else 0


def fitted_turns(prompt: Any, history: Sequence[Turn], question: Turn, context_length: int, answer_tokens: int,
                 reserve: int = 0) -> tuple[list[Turn], int, int]:
    """The turns of an ask: the end of `history`, then `question`. The oldest exchanges (a question
    and its answer) are left out until the prompt and `answer_tokens` fit `context_length` with
    `reserve` tokens to spare (the focus the question gets), or no history is left.

    Args:
        prompt: The workspace prompt (`WorkspacePrompt`); call on its thread.

    Returns:
        The turns, how many turns of `history` were left out (from its start) and the tokens the
        answer may have (`answer_room`).

    Raises:
        PromptTooLongError: The repository prefix and the question alone leave too little room for an answer.
    """
    dropped = 0
    while True:
        turns = [*history[dropped:], question]
        segments = prompt.segments(turns)
        if prompt_tokens(segments) + answer_tokens + reserve <= context_length or dropped >= len(history):
            break
        dropped += 2
    room = answer_room(segments, context_length, answer_tokens)
    if not room:
        raise PromptTooLongError(
            f"the repository prefix with the question and its selection come to {prompt_tokens(segments)} tokens, "
            f"which leave less than {min(answer_tokens, MIN_ANSWER_TOKENS)} tokens of the model's context of "
            f"{context_length} for an answer: select less, or lower context.budgetTokens")
    return turns, dropped, room
