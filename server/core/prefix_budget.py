"""How many tokens of the repository prefix a question can have: one computation for
`codectx ask` (which uses it) and `codectx context` (which shows what it holds)."""
from __future__ import annotations

from .settings import ContextSettings

RESERVED_TOKENS = 64
"""Slack for the chat template's framing of the question and the answer."""

ASK_MAX_TOKENS = 256
"""`codectx ask --max-tokens`' default, which `codectx context`'s default budget leaves room for."""


def prefix_budget(context: ContextSettings, context_length: int, max_tokens: int, question_tokens: int = 0) -> int:
    """The stable prefix's token budget: the `context.budgetTokens` setting, within what the
    model's context leaves once the question, the answer and the template's framing have room.

    Args:
        context: The context settings (their `budget_tokens`).
        context_length: The model's context window in tokens.
        max_tokens: The most tokens the answer may have.
        question_tokens: The question's tokens (0 when no question is known yet).

    Returns:
        A budget of at least 1 token.
    """
    room = context_length - max_tokens - question_tokens - RESERVED_TOKENS
    return max(1, min(context.budget_tokens, room))
