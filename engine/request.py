"""What a caller hands the engine and what it gets back.

A `Request` names its prompt either as plain token ids or as a sequence of
`PromptSegment`s (the stable-prefix layout built by `context`); the engine
streams `TokenEvent`s and ends every request with exactly one `DoneEvent`
(finish reason, metrics, and the error if there was one).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Iterable, Sequence

import numpy as np

_ids = itertools.count(1)


def new_request_id() -> str:
    return f"req-{next(_ids)}"


class Priority(IntEnum):
    """Lower runs first. Interactive work preempts warm-up at chunk boundaries."""

    INTERACTIVE = 0
    BACKGROUND = 10


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when temperature == 0 (the default)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class PromptSegment:
    """One piece of the prompt with its own identity.

    Args:
        kind: "system", "tools", "map", "file", "hot", "turn", "question", "header",
            "answer" (the model's own answer so far, right after its header).
        key: A stable name inside its kind (a path for files).
        token_ids: The segment's tokens, tokenized on their own.
        protected: Checkpoints at the end of this segment are evicted last.
    """

    kind: str
    key: str
    token_ids: tuple[int, ...]
    protected: bool = False


@dataclass
class Request:
    """One generation.

    Exactly one of `prompt_ids` or `segments` is set. `max_tokens=0` only
    prefills (background warm-up).
    """

    prompt_ids: Sequence[int] | None = None
    segments: Sequence[PromptSegment] | None = None
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

    def all_token_ids(self) -> list[int]:
        if self.prompt_ids is not None:
            return list(self.prompt_ids)
        return [t for s in self.segments for t in s.token_ids]


@dataclass
class Metrics:
    """The counters every request reports (DESIGN.md, "Metrics")."""

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
class TokenEvent:
    """Newly decoded text (a UTF-8-safe delta) and the token ids behind it."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class DoneEvent:
    """The last event of every request.

    finish_reason: "stop" (EOS or stop string), "length", "cancelled", "error".
    """

    request_id: str
    finish_reason: str
    text: str
    metrics: Metrics
    error: Exception | None = None


Event = TokenEvent | DoneEvent


def token_bytes(token_ids: Iterable[int]) -> bytes:
    """Token ids as little-endian uint32 bytes (what hashes and stores compare)."""
    return np.asarray(list(token_ids), dtype="<u4").tobytes()
