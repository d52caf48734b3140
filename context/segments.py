"""Segments: the units of the stable prefix, and the text each one holds.

A segment's text always ends with exactly one newline after a non-space
character and (except the first) starts with a non-space character. With the
chat template's fixed pieces attached to the segment that follows them, this
keeps tokenization concatenative: tokenizing segments one by one gives the ids
of the whole prompt (tests prove it for ByteLevel BPE tokenizers).

A `Segment` is what the engine takes: its kinds are `engine.request.SegmentKind`
(the MLX-free request module) and it has the fields of
`engine.request.SegmentLike`, so a layout goes into an `engine.request.Request`
as it is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import xxhash

from context.tags import Definition
from engine.request import SegmentKind

_SPECIAL = re.compile(r"<\|([A-Za-z0-9_]+)\|>")


@dataclass(frozen=True)
class Segment:
    """One piece of the prompt with its own identity.

    Attributes:
        kind: What it holds (`SegmentKind`: its properties decide how the engine treats it).
        key: A stable name inside its kind (the path for files).
        text: The exact text (template pieces included).
        hash: xxh3_64 hex of `text`.
        token_ids: `text` tokenized on its own.
        reason: Why it is here (pinned, dependency rank, hot, map-only, ...).
    """

    kind: SegmentKind
    key: str
    text: str
    hash: str
    token_ids: tuple[int, ...]
    reason: str = ""

    @property
    def protected(self) -> bool:
        """Checkpoints at its end are evicted last (`SegmentKind.protected`)."""
        return self.kind.protected

    def __len__(self) -> int:
        return len(self.token_ids)


def text_hash(text: str) -> str:
    """xxh3_64 hex of a text's UTF-8 bytes."""
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))


def neutralize(text: str) -> str:
    """Breaks chat control tokens written inside content (`<|im_end|>` -> `<\u200b|im_end|>`).

    Repository text must not close the system message or open a new turn.
    """
    return _SPECIAL.sub(lambda m: "<\u200b|" + m.group(1) + "|>", text) if "<|" in text else text


def block(text: str) -> str:
    """`text` without trailing whitespace, plus one newline (the segment boundary rule)."""
    return text.rstrip() + "\n"


FILE_FORMAT = "file-v1"
"""Changes whenever `file_text` changes shape (keys cached token counts of file segments)."""


def file_text(path: str, language: str, content: str) -> str:
    """A whole file as prompt text."""
    body = neutralize(content).rstrip()
    return f'<file path="{path}" language="{language}">\n{body}\n</file>\n' if body else \
        f'<file path="{path}" language="{language}">\n</file>\n'


def hot_file_text(path: str, language: str, content: str, replaces: bool) -> str:
    """The current text of an edited file, for the hot tail.

    Args:
        path: The file's path.
        language: Its language name.
        content: Its current text.
        replaces: True when an earlier copy of the file stays in its place above.
    """
    note = "edited; replaces the copy above" if replaces else "edited"
    body = neutralize(content).rstrip()
    head = f'<file path="{path}" language="{language}" note="{note}">\n'
    return f"{head}{body}\n</file>\n" if body else f"{head}</file>\n"


def deleted_text(path: str) -> str:
    """The hot-tail note for a file deleted since the last build (its copy stays above)."""
    return f'<file path="{path}" note="deleted; ignore the copy above"/>\n'


MAP_DEFINITIONS_PER_FILE = 40


def map_entry(path: str, definitions: Iterable[Definition]) -> str:
    """The signature-map lines of one file left out of the budget (at most 40 definitions)."""
    defs = list(definitions)
    lines = [f"{path}:"]
    lines += [f"  {d.line}: {neutralize(d.signature)}" for d in defs[:MAP_DEFINITIONS_PER_FILE]]
    if len(defs) > MAP_DEFINITIONS_PER_FILE:
        lines.append(f"  ({len(defs) - MAP_DEFINITIONS_PER_FILE} more definitions)")
    return "\n".join(lines) + "\n"


MAP_OPEN = "<map>\nSignatures of files not included in full (line: definition).\n"
MAP_CLOSE = "</map>\n"
