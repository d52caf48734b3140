"""The one check every transport runs on a question before any work is spent on it."""
from __future__ import annotations

from .errors import InvalidArgumentsError

EMPTY_QUESTION = "the question is empty: write what you want to know about the code"


class EmptyQuestionError(InvalidArgumentsError):
    """A question that is empty or only whitespace."""


def check_question(question: str) -> str:
    """Returns `question` when it has something other than whitespace in it.

    Raises:
        EmptyQuestionError: It is empty or only whitespace; the message (`EMPTY_QUESTION`)
            is the same from the CLI, the language server and HTTP.
    """
    if not question.strip():
        raise EmptyQuestionError(EMPTY_QUESTION)
    return question
