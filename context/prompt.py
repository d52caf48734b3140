"""A full prompt: the layout's prefix, then conversation turns, the question and the answer header."""
from __future__ import annotations

from typing import Sequence

from context.chat import ChatTemplate
from context.errors import TemplateError
from context.layout import Layout
from context.segments import Segment, text_hash
from context.tokencache import TokenCache
from engine.request import SegmentKind

DEFAULT_SYSTEM = ("You are codectx, a coding assistant. The repository below is your context: "
                  "files appear whole inside <file> tags, and files that did not fit appear as "
                  "signatures in the <map>. A file edited since it was placed appears again at the end; "
                  "that last copy is the current one. "
                  "Answer questions about this code precisely and cite paths.")
"""codectx's one system prompt (every workspace's default; also an ask without a repository)."""


def prompt_segments(layout: Layout, template: ChatTemplate, tokens: TokenCache, question: str,
                    turns: Sequence[tuple[str, str]] = (), focus: Sequence[Segment] = ()) -> list[Segment]:
    """`[prefix…][focus…][turn…][question][header]`; each template piece joins the segment after it.

    An assistant turn is two segments, `[header][answer]`, like the prompt that produced it
    followed by its answer (unless the answer starts with whitespace: then one "turn").

    Args:
        layout: The workspace prefix.
        template: The chat template the layout was built with.
        tokens: Token cache of the same tokenizer.
        question: The user's question.
        turns: Earlier (role, content) messages after the system message, oldest first.
        focus: `SegmentKind.FOCUS` segments (`context.focus`), placed after the prefix.

    Raises:
        TemplateError: The template frames the system message differently with these turns.
    """
    roles = ["system", *(role for role, _ in turns), "user"]
    pieces = template.frame(roles)
    if pieces[0] != layout.system_piece:
        raise TemplateError("chat template renders the system message differently depending on later turns")
    out = list(layout.segments) + list(focus)
    contents = [template.content(content) for _, content in turns] + [template.content(question)]
    kinds = [SegmentKind.TURN] * len(turns) + [SegmentKind.QUESTION]
    for i, (kind, piece, content) in enumerate(zip(kinds, pieces[1:], contents)):
        if roles[i + 1] == "assistant" and content[:1].strip():
            # [answer header][answer]: the same cut as when the answer was generated, so the
            # engine's checkpoints inside a long answer are found again (engine.prefix_cache).
            out.append(_segment(tokens, SegmentKind.HEADER, f"turn{i}", piece, "answer header"))
            out.append(_segment(tokens, SegmentKind.ANSWER, str(i), content, "assistant"))
            continue
        key = str(i) if kind == SegmentKind.TURN else "question"
        out.append(_segment(tokens, kind, key, piece + content, roles[i + 1]))
    out.append(_segment(tokens, SegmentKind.HEADER, "assistant", pieces[-1], "answer header"))
    return out


def _segment(tokens: TokenCache, kind: SegmentKind, key: str, text: str, reason: str) -> Segment:
    return Segment(kind, key, text, text_hash(text), tokens.encode(text), reason)
