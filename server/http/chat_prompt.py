"""OpenAI chat messages -> engine prompt segments, so that shared prefixes hit checkpoints.

Two layouts (docs/http.md, "How messages become segments"):

* **Plain model** (`message_segments`): the messages are rendered once with the
  model's chat template (tools and `chat_template_kwargs` included) and
  tokenized once, exactly like `Engine.chat_ids`. The token ids are then cut
  at message boundaries: one segment per message (the first system message is
  kind "system", protected; the last message "question"; the rest "turn";
  past `MAX_MESSAGE_CUTS` messages the middle ones share a segment) and the
  generation prompt as "header". The engine's checkpoints sit at
  those cuts, so a client that repeats its system prompt, tools and earlier
  turns restores them and recomputes only what is new.
* **Repository model** (`repository_turns`): the client's messages become the
  turns after the workspace prefix that the editor keeps warm; the prompt is
  the editor's own `[system][tools][map][files…][turns][question][header]`,
  so the repository's checkpoints are shared with the language server.
"""
from __future__ import annotations

import bisect
import json
from typing import Any, Sequence

from engine.request import PromptSegment, SegmentKind

from .errors import BadRequestError

REPOSITORY_MODEL = "codectx"
"""The model name that answers over the workspace prefix."""
MAX_MESSAGE_CUTS = 64
"""Messages (from the first) that each end a segment of their own; later ones share one."""


def _template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
    return [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages]


def render_messages(tokenizer: Any, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict] = (),
                    template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True) -> str:
    """The chat template's text for `messages` (tools and extra variables passed through).

    Raises:
        BadRequestError: The template rejects these messages.
    """
    messages = _template_messages(messages)
    try:
        if tokenizer.chat_template is None or not (tools or template_kwargs):
            return tokenizer.render_chat(messages, add_generation_prompt=add_generation_prompt,
                                         tools=list(tools) or None)
        return tokenizer.hf.apply_chat_template(messages, tools=list(tools) or None, tokenize=False,
                                                add_generation_prompt=add_generation_prompt,
                                                **(template_kwargs or {}))
    except Exception as err:  # jinja2 raises anything the template author chose
        raise BadRequestError(f"the chat template rejected these messages: {err}", param="messages",
                              code="template_error") from err


def _cut_indices(count: int) -> set[int]:
    """Which message ends get their own cut: the first `MAX_MESSAGE_CUTS`, and the two last.

    Each cut costs one template rendering of the messages before it, so cutting
    after every message of a long conversation would cost quadratic time; the
    messages in between share one segment (the engine still checkpoints it on
    its prefill grid).
    """
    return set(range(1, min(count, MAX_MESSAGE_CUTS) + 1)) | {count - 1, count}


def _char_cuts(tokenizer: Any, messages: Sequence[dict[str, Any]], full: str, tools: Sequence[dict],
               template_kwargs: dict[str, Any]) -> list[int | None]:
    """Character offset in `full` where each message ends (None where the template is not
    prefix-stable, or where the message shares the next one's segment)."""
    cuts: list[int | None] = []
    last = 0
    wanted = _cut_indices(len(messages))
    for i in range(1, len(messages) + 1):
        if i not in wanted:
            cuts.append(None)
            continue
        try:
            partial = render_messages(tokenizer, messages[:i], tools=tools, template_kwargs=template_kwargs,
                                      add_generation_prompt=False)
        except BadRequestError:  # e.g. templates that insist on a final user message
            cuts.append(None)
            continue
        ok = full.startswith(partial) and len(partial) > last
        cuts.append(len(partial) if ok else None)
        last = len(partial) if ok else last
    return cuts


def message_segments(tokenizer: Any, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict] = (),
                     template_kwargs: dict[str, Any] | None = None) -> list[PromptSegment]:
    """The prompt for `messages` on the plain model: one segment per message, then the header.

    The concatenated ids equal `tokenizer.encode(render_messages(...))`. CPU-bound
    (template rendering and tokenization): the HTTP app runs it on a worker thread.

    Raises:
        BadRequestError: The template rejects these messages.
    """
    template_kwargs = template_kwargs or {}
    full = render_messages(tokenizer, messages, tools=tools, template_kwargs=template_kwargs)
    # encode_batch releases the GIL while it runs (encode does not), so a long prompt
    # tokenized on a worker thread leaves the event loop free.
    encoding = tokenizer.hf.backend_tokenizer.encode_batch([full], add_special_tokens=False)[0]
    ids = list(encoding.ids)
    starts = [start for start, _ in encoding.offsets]
    segments: list[PromptSegment] = []
    begin = 0
    cuts = _char_cuts(tokenizer, messages, full, tools, template_kwargs)
    for i, (message, cut) in enumerate(zip(messages, cuts)):
        if cut is None:
            continue  # this message joins the next segment
        end = bisect.bisect_left(starts, cut)  # a token straddling the cut stays with this message
        if end <= begin:
            continue
        if i == len(messages) - 1:
            kind = SegmentKind.QUESTION
        elif not segments and message["role"] in ("system", "developer"):
            kind = SegmentKind.SYSTEM
        else:
            kind = SegmentKind.TURN
        # A client's system message is the prefix its next requests share: kept like a protected one.
        segments.append(PromptSegment(kind, f"{i}:{message['role']}", tuple(ids[begin:end]),
                                      protected=kind is SegmentKind.SYSTEM))
        begin = end
    if begin < len(ids):
        segments.append(PromptSegment(SegmentKind.HEADER, "assistant", tuple(ids[begin:])))
    return segments


def repository_turns(messages: Sequence[dict[str, Any]], tools: Sequence[dict] = ()) -> list[tuple[str, str]]:
    """(role, content) turns after the workspace prefix; the last one is the question.

    Client tools, which cannot enter the workspace's fixed template frame,
    become a system turn listing their JSON schemas.

    Raises:
        BadRequestError: The last message is not from the user.
    """
    if messages[-1]["role"] != "user":
        raise BadRequestError(f"the '{REPOSITORY_MODEL}' model needs the last message to be the user's",
                              param="messages")
    turns = [("system", "Tools you may call (JSON schemas):\n" + json.dumps(list(tools), indent=1))] if tools else []
    for m in messages:
        turns.append(("system" if m["role"] == "developer" else m["role"], m["content"]))
    return turns
