"""How many tokens of the repository prefix a question can have: one computation for
`codectx ask` (which uses it), `codectx context` (which shows what it holds) and the servers
(`server_context`: their questions are not known when the prefix is built)."""
from __future__ import annotations

import dataclasses
import logging

from .settings import ContextSettings, Settings

logger = logging.getLogger(__name__)

RESERVED_TOKENS = 64
"""Slack for the chat template's framing of the question and the answer."""

QUESTION_TOKENS = 512
"""Room a server's prefix leaves for an ask's question and earlier turns, beside the focus and the answer."""

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


def server_context(settings: Settings, context_length: int) -> ContextSettings:
    """The context settings a server's prefix is built with: a `budgetTokens` that leaves a model of
    `context_length` tokens room for an ask (`QUESTION_TOKENS`), its focus and its answer
    (`ask.maxTokens`); a larger setting is lowered (the default 6,000 suits the default model's 8,192
    tokens, not a smaller model's), and the log says so."""
    focus = settings.focus.budget_tokens if settings.focus.enabled else 0
    budget = prefix_budget(settings.context, context_length, settings.ask.max_tokens, QUESTION_TOKENS + focus)
    if budget < settings.context.budget_tokens:
        logger.info("context.budgetTokens %d leaves no room for an ask in the model's context of %d tokens; the "
                    "prefix gets %d", settings.context.budget_tokens, context_length, budget)
    return dataclasses.replace(settings.context, budget_tokens=budget)
