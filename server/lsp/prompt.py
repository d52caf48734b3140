"""Conversation turns: the messages after the repository in a prompt.

The prompt itself is built by `context` (see `workspace_prompt.WorkspacePrompt`): one
builder, one access policy, one chat-template fallback.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    """One chat message after the repository (a question, answer or tool result)."""

    role: str
    content: str
