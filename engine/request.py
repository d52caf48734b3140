"""What a caller hands the engine and what it gets back.

A `Request` names its prompt either as plain token ids or as a sequence of
segments (the stable-prefix layout built by `context`, taken as it is: any
object with `kind`, `key`, `token_ids` and `protected` is one, see
`SegmentLike`); the engine streams `TokenEvent`s and ends every request with
exactly one `DoneEvent` (finish reason, metrics, and the error if there was
one). `SegmentKind` is the one vocabulary of segment kinds. No MLX here.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol, Sequence

_ids = itertools.count(1)


def new_request_id() -> str:
    return f"req-{next(_ids)}"


class Priority(IntEnum):
    """Lower runs first; FIFO within a priority.

    - INTERACTIVE: someone waits for the answer (a hover, an ask, a code action,
      an HTTP request).
    - BACKGROUND: warm-up, which keeps the repository prefix prefilled; every
      other request starts from what it leaves.
    - PREPARE: work ahead of a request the user may make (hover answer heads,
      prepared hover answers). It builds on the prefix warm-up keeps, so it
      comes after warm-up: preparing over a prefix warm-up is about to replace
      computes a prompt no hover will send.

    A request still in prefill yields to a more urgent arrival at the next
    chunk boundary: it rolls back to its last checkpoint and is queued again in
    its old place. A PREPARE request also yields while it decodes: outranked, it
    ends "cancelled" at the next decode step (a prepared answer is a guess, not
    worth delaying anyone), and its caller may submit it again.
    """

    INTERACTIVE = 0
    BACKGROUND = 10
    PREPARE = 20


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen and when a generation is stopped early.

    Greedy when temperature == 0 (the default). `repetition_penalty` > 1 makes
    the tokens this request already generated less likely (`engine.sampling.
    RepetitionPenalty`; 1.0 leaves the logits untouched); `loop_guard` ends the
    generation with finish reason "repetition" once its output repeats itself
    (`engine.loop_guard`; the server turns it on, `generation.loopGuard`).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    """Any integer (an API's seed may be negative or wider than 64 bits); the samplers take it modulo 2**64."""
    repetition_penalty: float = 1.0
    loop_guard: bool = False

    def __post_init__(self) -> None:
        if self.seed is not None:  # MLX's and NumPy's generators take unsigned 64-bit seeds only
            object.__setattr__(self, "seed", int(self.seed) % 2**64)


class SegmentKind(StrEnum):
    """What a prompt segment holds; its properties decide how the engine treats it.

    Str-valued: `SegmentKind.FILE == "file"`, and JSON, msgpack and logs see the
    plain name. In prompt order:

    - SYSTEM, TOOLS: the instructions and tool descriptions (with the template's
      framing before them).
    - MAP: signatures of the files that did not fit whole.
    - FILE: one repository file, whole (key: its path).
    - HOT: the current copy of a file edited since the layout was built.
    - FOCUS: definitions and files one request is about (context.focus), after the
      stable prefix and before the turns: chosen per question, so not stable; each
      one's end is an anchor, so a question about the same code restores them.
    - TURN: an earlier chat message.
    - QUESTION: the message being answered.
    - HEADER: the chat template's response header before an answer.
    - ANSWER: the model's answer so far (after its header: a continuation, a hover).
    - PROMPT: the single segment the engine makes of a plain token prompt
      (`Request.prompt_ids`).

    Properties (the same for every segment of a kind):

    - stable: part of the repository prefix, what warm-up prefills and a question
      leaves unchanged (system, tools, map, files and the hot tail).
    - dense: never windowed by windowed prefill. The windowed region is the
      leading run of stable kinds that are not dense (system, tools, map, files)
      less a dense tail; everything from the first other segment on is dense.
      A plain prompt (PROMPT) is windowed by its own rule (all but its last
      `continuation_tail` tokens), so it is not dense.
    - anchor: a checkpoint goes at its end and at the end of the segment before
      it, and the checkpoint grid restarts there: an edit (a hot copy) or a new
      question recomputes only the tail, never a grid step of the files before it.
    - protected: checkpoints at its end are evicted last. The input boundary (the
      end of the question and of the response header; one boundary when the
      question is short, `engine.boundaries.cut_points`) is what a regenerate, a
      follow-up turn and a continuation restore. Both carry it because eviction
      drops a checkpoint together with everything chained after it, so a
      protected header after an unprotected question would go with the question.
      A segment may ask for more with its own `protected` flag (a system message
      many conversations share; the engine's checkpoints inside a long answer).
    - archived: its checkpoints go to the disk archive. The question, header and
      answer of one request are not worth a disk write; turns are (a follow-up
      conversation restores them after a restart; a short turn the header joins
      ends in the header's boundary, so it is recomputed).
    """

    SYSTEM = "system"
    TOOLS = "tools"
    MAP = "map"
    FILE = "file"
    HOT = "hot"
    FOCUS = "focus"
    TURN = "turn"
    QUESTION = "question"
    HEADER = "header"
    ANSWER = "answer"
    PROMPT = "prompt"

    @property
    def stable(self) -> bool:
        """Part of the repository prefix (what warm-up prefills)."""
        return self in _STABLE

    @property
    def dense(self) -> bool:
        """Never windowed by windowed prefill."""
        return self in _DENSE

    @property
    def anchor(self) -> bool:
        """A boundary the engine always checkpoints (with the end of the segment before it)."""
        return self in _ANCHOR

    @property
    def protected(self) -> bool:
        """Checkpoints at its end are evicted last."""
        return self in _PROTECTED

    @property
    def archived(self) -> bool:
        """Its checkpoints are written to the disk archive."""
        return self not in _ONE_OFF


_S = SegmentKind
_STABLE = frozenset({_S.SYSTEM, _S.TOOLS, _S.MAP, _S.FILE, _S.HOT})
_DENSE = frozenset({_S.HOT, _S.FOCUS, _S.TURN, _S.QUESTION, _S.HEADER, _S.ANSWER})
_ANCHOR = frozenset({_S.HOT, _S.FOCUS, _S.TURN, _S.QUESTION, _S.HEADER, _S.ANSWER})
_PROTECTED = frozenset({_S.QUESTION, _S.HEADER})
_ONE_OFF = frozenset({_S.QUESTION, _S.HEADER, _S.ANSWER})


def segment_kind(segment: SegmentLike) -> SegmentKind:
    """`segment.kind` as a `SegmentKind` (a caller's segment may carry the plain name).

    Raises:
        ValueError: The kind names no `SegmentKind`.
    """
    try:
        return SegmentKind(segment.kind)
    except ValueError as err:
        raise ValueError(f"unknown segment kind {segment.kind!r}") from err


def stable_part(segments: Sequence[SegmentLike]) -> list[SegmentLike]:
    """The leading segments of a stable kind: the repository prefix of a prompt."""
    part = []
    for segment in segments:
        if not segment_kind(segment).stable:
            break
        part.append(segment)
    return part


class SegmentLike(Protocol):
    """What the engine reads of a prompt segment.

    `PromptSegment` is one, and so is `context.segments.Segment`: the layout
    `context` builds goes into a `Request` as it is.
    """

    @property
    def kind(self) -> SegmentKind:
        """What the segment holds."""

    @property
    def key(self) -> str:
        """A stable name inside its kind (a path for files)."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The segment's tokens, tokenized on their own."""

    @property
    def protected(self) -> bool:
        """Checkpoints at its end are evicted last (at least when its kind is protected)."""


@dataclass(frozen=True)
class PromptSegment:
    """One piece of the prompt with its own identity (for callers without `context`).

    Args:
        kind: A `SegmentKind` or its name ("file"); stored as the `SegmentKind`.
        key: A stable name inside its kind (a path for files).
        token_ids: The segment's tokens, tokenized on their own.
        protected: Checkpoints at the end of this segment are evicted last; always
            true for a protected kind, may be set for any other.

    Raises:
        ValueError: `kind` names no `SegmentKind`.
    """

    kind: SegmentKind
    key: str
    token_ids: tuple[int, ...]
    protected: bool = False

    def __post_init__(self) -> None:
        kind = segment_kind(self)
        object.__setattr__(self, "kind", kind)
        if kind.protected and not self.protected:
            object.__setattr__(self, "protected", True)


@dataclass
class Request:
    """One generation.

    Exactly one of `prompt_ids` or `segments` is set. `max_tokens=0` only
    prefills (background warm-up).

    Raises:
        ValueError: Both or neither prompt given, `max_tokens` < 0, or a
            segment's kind names no `SegmentKind`.
    """

    prompt_ids: Sequence[int] | None = None
    segments: Sequence[SegmentLike] | None = None
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    priority: Priority = Priority.INTERACTIVE
    request_id: str = field(default_factory=new_request_id)

    def __post_init__(self) -> None:
        if (self.prompt_ids is None) == (self.segments is None):
            raise ValueError("Request needs exactly one of prompt_ids or segments")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens}")
        for segment in self.segments or ():
            segment_kind(segment)

    def continues_answer(self) -> bool:
        """Whether the prompt ends inside the model's answer (a hover's "`name` is", a long
        answer's continuation): the generated text then continues it, leading space and all."""
        return self.prompt_ids is None and bool(self.segments) and segment_kind(self.segments[-1]) is SegmentKind.ANSWER

    def all_token_ids(self) -> list[int]:
        return self.token_ids_from(0)

    def token_ids_from(self, start: int) -> list[int]:
        """The prompt's token ids from position `start` on, without building the part before it (a restored
        prefix's)."""
        if self.prompt_ids is not None:
            return list(self.prompt_ids[start:])
        out: list[int] = []
        pos = 0
        for s in self.segments or ():
            n = len(s.token_ids)
            if pos + n > start:
                out.extend(s.token_ids[max(0, start - pos):])
            pos += n
        return out

    def prompt_length(self) -> int:
        """`len(all_token_ids())` without building the list (131k tokens: 0.68 ms of host time saved,
        `bench/host_time.py`)."""
        if self.prompt_ids is not None:
            return len(self.prompt_ids)
        return sum(len(s.token_ids) for s in self.segments)


@dataclass
class Metrics:
    """The counters every request reports (docs/architecture.md)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0          # restored from a checkpoint
    recomputed_tokens: int = 0      # prefilled in this request
    prefill_s: float = 0.0
    ttft_s: float = 0.0             # submit -> first token event
    queue_s: float = 0.0            # submit -> worker picked it up
    decode_tokens: int = 0
    decode_s: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    draft_cached_tokens: int = 0      # the draft model's prompt tokens restored from its checkpoints
    draft_recomputed_tokens: int = 0  # the draft model's prompt tokens prefilled in this request
    checkpoint_bytes: int = 0
    miss_reason: str | None = None
    loop_period: int = 0            # the loop guard stopped a loop of this many keys per copy (engine.loop_guard)
    loop_tokens: int = 0            # ... whose repeated tail covered this many keys

    @property
    def prefill_tps(self) -> float:
        return self.recomputed_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(prefill_tps=self.prefill_tps, decode_tps=self.decode_tps, acceptance=self.acceptance)
        return d


@dataclass(frozen=True)
class Probe:
    """How much of a prompt the engine can restore right now (`Engine.probe`).

    Attributes:
        prompt_tokens: Tokens in the prompt.
        warm_tokens: Leading tokens held at a checkpoint, in memory or in the
            disk archive. (A request over exactly this prompt restores up to its
            last checkpoint before the end and computes the rest, since it needs
            the last position's logits.)
        archived_tokens: Of `warm_tokens`, those a restore reads from the archive.
        warm_segments: Leading segments wholly within `warm_tokens` (the warm
            part ends inside or after segment `warm_segments`).
        miss: Why the warm part ends there, as in `Metrics.miss_reason`: "new
            prefix", "diverged at token N", "policy mismatch", "evicted" or
            "corrupt archive entry"; None when the whole prompt is warm.
    """

    prompt_tokens: int
    warm_tokens: int
    archived_tokens: int = 0
    warm_segments: int = 0
    miss: str | None = None

    @property
    def warm(self) -> bool:
        """The whole (non-empty) prompt is held."""
        return self.prompt_tokens > 0 and self.warm_tokens == self.prompt_tokens


@dataclass(frozen=True)
class TokenEvent:
    """Newly decoded text (a UTF-8-safe delta) and the token ids behind it."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class DoneEvent:
    """The last event of every request.

    finish_reason: "stop" (EOS or stop string), "length", "repetition" (the loop
    guard stopped a loop; the repeated text stays in `text`), "cancelled", "error".
    """

    request_id: str
    finish_reason: str
    text: str
    metrics: Metrics
    error: Exception | None = None


Event = TokenEvent | DoneEvent
