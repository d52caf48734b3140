"""Prompt-lookup drafting: propose the tokens that followed the same n-gram before.

Code answers quote the code they read. When the last few generated tokens
already occurred in the prompt (repository segments, conversation) or in the
earlier output, the tokens that followed them there are a cheap, often correct
guess for what comes next. No extra model and no extra memory beyond an
n-gram index over the token history.

The draft is a deterministic function of the history, which is what the
rejection sampler in `engine.speculative` relies on for temperature > 0.
"""
from __future__ import annotations

from typing import Sequence


class PromptLookupDrafter:
    """Drafts by matching the history's last n tokens against its earlier tokens.

    The longest n in [min_ngram, max_ngram] with an earlier occurrence wins;
    among occurrences of that n-gram the most recent one is used. The draft
    length k adapts to recent acceptance: a fully accepted draft grows k, a
    partially accepted one shrinks k to just past what was accepted.

    Args:
        max_ngram: Longest suffix to match.
        min_ngram: Shortest suffix to match (1 drafts after any repeated token).
        k_min: Smallest draft length.
        k_max: Largest draft length.
        k_start: Draft length of the first round.
    """

    def __init__(
        self,
        max_ngram: int = 4,
        min_ngram: int = 2,
        k_min: int = 1,
        k_max: int = 10,
        k_start: int = 4,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if not 1 <= k_min <= k_start <= k_max:
            raise ValueError(f"need 1 <= k_min <= k_start <= k_max, got {k_min}, {k_start}, {k_max}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.k_min = k_min
        self.k_max = k_max
        self.k_start = k_start
        self.k = k_start
        self._tokens: list[int] = []
        # n-gram -> position right after its most recent occurrence that has a
        # continuation (the n-gram ends strictly before the end of history).
        self._index: dict[tuple[int, ...], int] = {}

    def reset(self) -> None:
        """Forget the history and the adapted k (a new request)."""
        self._tokens = []
        self._index = {}
        self.k = self.k_start

    def draft(self, history: Sequence[int], k: int | None = None) -> list[int]:
        """Propose up to k tokens to follow `history`.

        Args:
            history: Every token so far (prompt then output). Successive calls
                usually extend the previous history; any other history
                rebuilds the index.
            k: Draft length; the adapted `self.k` when None.

        Returns:
            Between 0 and k token ids (0 when the suffix never occurred before).
        """
        self._sync(history)
        k = self.k if k is None else k
        toks = self._tokens
        for n in range(min(self.max_ngram, len(toks) - 1), self.min_ngram - 1, -1):
            start = self._index.get(tuple(toks[-n:]))
            if start is not None:
                return toks[start : start + k]
        return []

    def observe(self, drafted: int, accepted: int) -> None:
        """Adapt k to the outcome of the last verification round."""
        if drafted == 0:
            return
        if accepted == drafted:
            self.k = min(self.k_max, self.k + 2)
        else:
            self.k = max(self.k_min, accepted + 1)

    def _sync(self, history: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(history) < known or list(history[:known]) != self._tokens:
            self._tokens, self._index = [], {}
            known = 0
        for tok in history[known:]:
            self._append(int(tok))

    def _append(self, token: int) -> None:
        # Register the n-grams ending just before the new token: they now have
        # a continuation (this token) at position `pos`.
        toks = self._tokens
        pos = len(toks)
        for n in range(self.min_ngram, min(self.max_ngram, pos) + 1):
            self._index[tuple(toks[pos - n : pos])] = pos
        toks.append(token)
