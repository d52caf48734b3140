"""A full prompt: the layout's prefix, then conversation turns, the question and the answer header."""
from __future__ import annotations

from typing import Sequence

from context.chat import ChatTemplate
from context.errors import TemplateError
from context.layout import Layout
from context.segments import Segment, text_hash
from context.tokencache import TokenCache


def prompt_segments(layout: Layout, template: ChatTemplate, tokens: TokenCache, question: str,
                    turns: Sequence[tuple[str, str]] = ()) -> list[Segment]:
    """`[prefix…][turn…][question][header]`; each template piece joins the segment after it.

    An assistant turn is two segments, `[header][answer]`, like the prompt that produced it
    followed by its answer (unless the answer starts with whitespace: then one "turn").

    Args:
        layout: The workspace prefix.
        template: The chat template the layout was built with.
        tokens: Token cache of the same tokenizer.
        question: The user's question.
        turns: Earlier (role, content) messages after the system message, oldest first.

    Raises:
        TemplateError: The template frames the system message differently with these turns.
    """
    roles = ["system", *(role for role, _ in turns), "user"]
    pieces = template.frame(roles)
    if pieces[0] != layout.system_piece:
        raise TemplateError("chat template renders the system message differently depending on later turns")
    out = list(layout.segments)
    contents = [template.content(content) for _, content in turns] + [template.content(question)]
    kinds = ["turn"] * len(turns) + ["question"]
    for i, (kind, piece, content) in enumerate(zip(kinds, pieces[1:], contents)):
        if roles[i + 1] == "assistant" and content[:1].strip():
            # [answer header][answer]: the same cut as when the answer was generated, so the
            # engine's checkpoints inside a long answer are found again (engine.prefix_cache).
            out.append(Segment("header", f"turn{i}", piece, text_hash(piece), tokens.encode(piece), "answer header"))
            out.append(Segment("answer", str(i), content, text_hash(content), tokens.encode(content), "assistant"))
            continue
        text = piece + content
        out.append(Segment(kind, str(i) if kind == "turn" else "question", text, text_hash(text),
                           tokens.encode(text), roles[i + 1]))
    header = pieces[-1]
    out.append(Segment("header", "assistant", header, text_hash(header), tokens.encode(header), "answer header"))
    return out
