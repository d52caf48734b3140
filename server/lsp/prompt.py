"""Prompt layout: the seam between the server and the context package.

`LocalPrompt` is a small stand-in for `context.Workspace` (which orders files
by dependencies and caches token ids): it lists the workspace's text files in
path order, puts open buffers' unsaved text in place of the disk text, and
renders `[system][file]...[file][turns][question+header]` with the model's
chat template. Replace it by an adapter over `context.Workspace` exposing the
same two methods (`segments`, `layout`).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from engine.request import PromptSegment

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are codectx, an assistant that answers questions about the repository below. "
    "Be brief and precise; cite file paths."
)
TEXT_SUFFIXES = {".py", ".js", ".ts", ".tsx", ".go", ".rs", ".java", ".c", ".h", ".cpp",
                 ".hpp", ".md", ".txt", ".toml", ".json", ".yaml", ".yml", ".lua", ".sh"}
MAX_FILE_BYTES = 256 * 1024


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def render_chat(self, messages, add_generation_prompt: bool = True, tools=None) -> str: ...


@dataclass(frozen=True)
class Turn:
    """One chat message after the repository (a question, answer or tool result)."""

    role: str
    content: str


def scan_files(root: Path) -> list[Path]:
    """Text files under `root` in path order, skipping hidden and virtual-env trees."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in {
            "node_modules", "__pycache__", "venv", "build", "dist"})
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.suffix in TEXT_SUFFIXES and not path.is_symlink() and path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path)
    return found


class LocalPrompt:
    """Builds prompt segments for the workspace at `root`.

    Args:
        root: The workspace folder.
        tokenizer: The model's tokenizer (`encode`, `render_chat`).
        buffer_text: Returns an open buffer's text for a path, or None.
        system_extra: Text appended to the system prompt (the tool list).
        budget_tokens: Files are added in order until this budget is reached.
    """

    def __init__(self, root: Path, tokenizer: Tokenizer, buffer_text: Callable[[Path], str | None],
                 system_extra: str = "", budget_tokens: int = 6000) -> None:
        self.root = root
        self.tokenizer = tokenizer
        self.buffer_text = buffer_text
        self.system_extra = system_extra
        self.budget_tokens = budget_tokens
        self._files: list[Path] = scan_files(root)

    @property
    def files(self) -> list[Path]:
        """The workspace's text files, in path order."""
        return list(self._files)

    def mark_dirty(self, path: Path) -> None:
        """Nothing to do: buffers are read when the prompt is built."""

    def rescan(self) -> None:
        self._files = scan_files(self.root)

    def _file_blocks(self) -> list[tuple[str, str]]:
        blocks, used = [], 0
        for path in self._files:
            text = self.buffer_text(path)
            if text is None:
                try:
                    text = path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
            rel = path.relative_to(self.root).as_posix()
            block = f"\n\n### {rel}\n```\n{text}\n```"
            cost = len(block) // 3  # cheap estimate; exact counts come from the tokenizer later
            if used + cost > self.budget_tokens:
                break
            blocks.append((rel, block))
            used += cost
        return blocks

    def segments(self, turns: Sequence[Turn]) -> list[PromptSegment]:
        """The prompt for `turns` (the last one is the question), as segments."""
        blocks = self._file_blocks()
        system = SYSTEM_PROMPT + self.system_extra + "".join(b for _, b in blocks)
        head = self.tokenizer.render_chat([{"role": "system", "content": system}], add_generation_prompt=False)
        messages = [{"role": "system", "content": system}] + [{"role": t.role, "content": t.content} for t in turns]
        full = self.tokenizer.render_chat(messages, add_generation_prompt=True)
        if not full.startswith(head):
            return [PromptSegment("question", "all", tuple(self.tokenizer.encode(full)))]
        bounds, cursor = [0], 0
        for _, block in blocks:
            cursor = head.index(block, cursor)
            bounds.append(cursor)
        bounds.append(len(head))
        names = [("system", "system")] + [("file", rel) for rel, _ in blocks]
        pieces = [(kind, key, head[a:b]) for (kind, key), a, b in zip(names, bounds, bounds[1:])]
        pieces.append(("question", "question", full[len(head):]))
        return [PromptSegment(kind, key, tuple(self.tokenizer.encode(text)), protected=kind == "question")
                for kind, key, text in pieces if text]

    def prefix_segments(self) -> list[PromptSegment]:
        """The stable prefix alone (system and files): what warm-up prefills."""
        return [s for s in self.segments([Turn("user", "")]) if s.kind != "question"]

    def layout(self) -> list[dict]:
        """One row per prefix segment: kind, key, tokens (for `codectx.showContext`)."""
        return [{"kind": s.kind, "key": s.key, "tokens": len(s.token_ids)} for s in self.prefix_segments()]
