"""The loop guard: ends a generation whose output has started repeating itself.

The rule (docs/configuration.md, "Loop guard"): after each generated token,
the output is looping when its tail is one period of `p` tokens (1 <= p <=
`LoopRule.max_period`) repeated so that the periodic tail covers at least
`min_repeats` whole copies of the period and at least `min_tokens` tokens:

    covered(p) = p + (the number of trailing tokens t[i] with t[i] == t[i - p])
    copies(p)  = 2 if p >= long_period else min_repeats
    looping   <=> covered(p) >= max(copies(p) * p, min_tokens) for some p

With the defaults (64, 3, 24, 24) a one-token run stops at its 24th token, a
two-token cycle after 12 copies, a 7-token cycle at 24 tokens (3 copies and 3
tokens of the fourth), a 20-token line at the end of its 3rd copy (60 tokens), a
24-token sentence at the end of its 2nd (48) and a 40-token paragraph at the end
of its 2nd (80).
Three copies, not four: on the answers benchmark the default model's phrase loops
("that is a type of the class `X`" three times over) ended by themselves after a
third copy, so a rule of four never saw them. Two copies for long periods: there
the model repeated whole 30-50-token paragraphs, whose third copy does not fit a
128-token answer, so they ran to the limit; the same 24 tokens twice in a row is
a loop, not prose. The check is incremental:
one comparison per period per token, O(max_period). It sees only the tokens
the request generated (not the prompt), so it is deterministic: warm and cold
runs, plain and speculative decoding stop at the same token.

The engine compares tokens by their `LoopKeys`, and every count above is of
keys: a token's text without the whitespace around it, whitespace-only tokens
left out (but for the second and later of a run of them: endless blank output
is a loop too, one "blank" key each). The default model repeats a sentence
with its line breaks in other places ("...to run a Python" then "...to run
a\\nPython"): as ids those copies differ, as keys they are the same. A token
that is not whole text alone (a byte of a multi-byte character) keeps its id
as its key. Two copies from 24 keys rather than 32 tokens: without the line
breaks the paragraphs above are 31-48 keys, and the README's first question
got a 24-key sentence twice in a row (then twice more), which a 32 never
stopped. Real code does repeat itself closely: a 21-key argument twice in a
row is in this repository's tests (`bench/loop_replay.py` reads the margins on
a corpus).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from .request import Metrics


@dataclass(frozen=True)
class LoopRule:
    """When a repeating tail counts as a loop (module docstring).

    Attributes:
        max_period: Longest period checked, in tokens.
        min_repeats: Whole copies of the period the tail must hold.
        min_tokens: Tokens the periodic tail must cover (whatever the period).
        long_period: From this period on, two whole copies are a loop.
    """

    max_period: int = 64
    min_repeats: int = 3
    min_tokens: int = 24
    long_period: int = 24

    def __post_init__(self) -> None:
        if self.max_period < 1 or self.min_repeats < 2 or self.min_tokens < 2 or self.long_period < 1:
            raise ValueError("a loop rule needs max_period >= 1, min_repeats >= 2, min_tokens >= 2 and "
                             f"long_period >= 1: {self}")

    def threshold(self, period: int) -> int:
        """Tokens a tail of this period must cover to be a loop."""
        copies = 2 if period >= self.long_period else self.min_repeats
        return max(copies * period, self.min_tokens)


class LoopDetector:
    """Watches a token stream and says when its tail satisfies the `LoopRule`.

    Attributes:
        period: The smallest period that fired (0 until then).
        covered: Tokens the periodic tail covered when it fired.
    """

    def __init__(self, rule: LoopRule = LoopRule()) -> None:
        self.rule = rule
        self._recent: list[int] = []  # the last tokens, at least max_period of them once there
        self._matches = [0] * (rule.max_period + 1)  # trailing t[i] == t[i - p] run, per p
        self._thresholds = [rule.threshold(p) for p in range(rule.max_period + 1)]
        self.period = 0
        self.covered = 0

    def push(self, token: int) -> bool:
        """Adds the next token; True when the output is now looping (and from then on)."""
        if self.period:
            return True
        recent, matches, thresholds = self._recent, self._matches, self._thresholds
        n = len(recent)
        for p in range(1, min(n, self.rule.max_period) + 1):
            run = matches[p] + 1 if recent[n - p] == token else 0
            matches[p] = run
            if run and not self.period and run + p >= thresholds[p]:
                self.period, self.covered = p, run + p
        recent.append(token)
        if len(recent) > 2 * self.rule.max_period:
            del recent[: -self.rule.max_period]
        return bool(self.period)

    def push_all(self, tokens: Iterable[int]) -> bool:
        """Pushes tokens in order, stopping at the first that fires; True when one did."""
        return any(self.push(t) for t in tokens)


BLANK = -(1 << 62)
"""The key of a whitespace-only token that follows another (no token's own key)."""


class LoopKeys:
    """Token id -> what the loop guard compares (module docstring); None for a whitespace-only token.

    Keys are small ints: one per distinct stripped text (from 0 up), and ``-1 - id`` for a token whose
    text alone is not whole (it decodes to U+FFFD), so distinct bytes never match. Filled lazily, one
    `decode` per distinct token the model generates; shared by every request of one tokenizer.

    Args:
        decode: Text of a list of token ids (`engine.tokenizer.Tokenizer.decode`).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._keys: dict[int, int | None] = {}
        self._texts: dict[str, int] = {}
        self._lock = threading.Lock()  # a miss numbers a new text: two threads must not give two texts one number

    def __call__(self, token: int) -> int | None:
        try:
            return self._keys[token]
        except KeyError:
            text = self._decode([token])
            with self._lock:
                if "\ufffd" in text:
                    key: int | None = -1 - token
                else:
                    stripped = text.strip()
                    key = self._texts.setdefault(stripped, len(self._texts)) if stripped else None
                self._keys[token] = key
            return key


class LoopGuard:
    """The engine's use of a `LoopDetector` for one request.

    `watch` passes tokens through and ends the stream after the token that makes
    the output a loop (that token is still yielded and streamed: the text already
    shown stays); `fired` then says why the stream ended, and the request's
    metrics get the loop's period and length. `observe` is the same check for a
    caller that streams each token itself (a batch of answers, `engine.batch`).

    Args:
        enabled: False passes every token through and never fires.
        metrics: Receives `loop_period` and `loop_tokens` when the guard fires (counted in keys).
        keys: What to compare (`LoopKeys`; a None key is skipped); None compares the ids themselves.
        rule: When a tail counts as a loop.
    """

    def __init__(self, enabled: bool, metrics: Metrics, keys: Callable[[int], int | None] | None = None,
                 rule: LoopRule = LoopRule()) -> None:
        self._detector = LoopDetector(rule) if enabled else None
        self._metrics = metrics
        self._keys = keys
        self._blank = False  # the last token was whitespace only
        self.fired = False

    def watch(self, tokens: Iterator[int]) -> Iterator[int]:
        """`tokens`, ending after the first token that completes a loop."""
        for token in tokens:
            yield token
            if self.observe(token):
                return

    def observe(self, token: int) -> bool:
        """Adds a token already streamed; True when it completes a loop (the stream ends there)."""
        detector = self._detector
        if detector is None or self.fired:
            return self.fired
        key = token if self._keys is None else self._keys(token)
        if key is None:  # whitespace only: skipped (a moved line break), unless it follows whitespace
            key, self._blank = (BLANK if self._blank else None), True
        else:
            self._blank = False
        if key is not None and detector.push(key):
            self.fired = True
            self._metrics.loop_period, self._metrics.loop_tokens = detector.period, detector.covered
        return self.fired


class TextLoopGuard:
    """A `LoopGuard` over streamed text: an answer whose tokens never reach this process (a remote engine's).

    The text not yet checked is tokenized here with the model's tokenizer up to where its last run of
    whitespace begins: pre-tokenizers split there, and the run stays with the word after it, so those tokens
    are the whole text's (a word still arriving, " subclas" of " subclass", waits). Text without whitespace
    after its start (CJK, a long identifier run) waits up to `HOLD_CHARS` characters, then all but its last
    `HELD` tokens are checked (a few more when the cut falls inside one character's bytes), provided they
    decode back to its start; whatever is left goes at `MAX_PENDING` characters, and at the stream's end
    (`finish`). The tokens are the local tokenizer's reading of the text, not necessarily the server's (a byte
    the server could not decode alone arrives as U+FFFD); the keys they compare as are the same text either
    way.

    Args:
        guard: The request's guard (`LoopGuard`, with the tokenizer's keys).
        encode: Token ids of a text (the model's tokenizer).
        decode: Text of token ids (the same tokenizer).

    Attributes:
        tokens: Tokens checked so far.
    """

    HELD = 2
    HOLD_CHARS = 64
    MAX_PENDING = 512
    _LAST_RUN = re.compile(r"\s+\S*\Z")

    def __init__(self, guard: LoopGuard, encode: Callable[[str], Sequence[int]],
                 decode: Callable[[Sequence[int]], str]) -> None:
        self.guard = guard
        self._encode, self._decode = encode, decode
        self._pending = ""
        self.tokens = 0

    def feed(self, text: str) -> bool:
        """Adds the next streamed text; True when the answer is now a loop (and from then on)."""
        pending = self._pending = self._pending + text
        if self.guard.fired:
            return True
        last_run = self._LAST_RUN.search(pending)
        if last_run is not None and last_run.start() > 0:
            self._pending = pending[last_run.start():]
            return self._observe(self._encode(pending[:last_run.start()]))
        if len(pending) <= self.HOLD_CHARS:
            return False
        ids = list(self._encode(pending))
        for held in range(self.HELD, self.HELD + 4):  # more when the cut falls inside a character's bytes
            checked, start = ids[:-held], self._decode(ids[:-held])
            if pending.startswith(start):
                break
        else:  # the tokens do not give the text back (a normalizer): wait, up to MAX_PENDING
            if len(pending) <= self.MAX_PENDING:
                return False
            checked, start = ids, pending
        self._pending = pending[len(start):]
        return self._observe(checked)

    def finish(self) -> bool:
        """Checks the text the stream ended on; True when the answer is a loop."""
        pending, self._pending = self._pending, ""
        return self._observe(self._encode(pending) if pending else [])

    def _observe(self, ids: Sequence[int]) -> bool:
        for token in ids:
            if self.guard.fired:
                break
            self.tokens += 1
            self.guard.observe(token)
        return self.guard.fired
