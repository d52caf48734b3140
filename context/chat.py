"""Chat templates rendered around sentinels, so a prompt splits into fixed pieces and contents.

Rendering the template once with sentinel strings as message contents gives the
template's own text between contents ("fixed pieces"). A prompt is then
`piece[0] + content[0] + piece[1] + ... + piece[n]`, and each piece can be
attached to the segment after it. Because every segment boundary sits next to a
special token or between a line end and a non-space character, tokenizing the
segments one by one gives the same ids as tokenizing the whole rendered prompt
(tests prove this for the SmolLM2 and a Qwen-style template).
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from functools import lru_cache
from typing import Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from context.errors import TemplateError

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, used when a tokenizer has no template of its own."""

_SENTINEL = "\ue000codectx-{}\ue001"
_PROBES = ("  probe one \n\n", "\nprobe two\t", "probe three")


def _raise(message: str):
    raise jinja2.TemplateError(message)


def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    # A fixed clock keeps renders reproducible (templates that print today's date).
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 1, 1, tzinfo=timezone.utc).strftime(fmt)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(source)
    except jinja2.TemplateError as err:
        raise TemplateError(f"chat template does not compile: {err}") from err


class ChatTemplate:
    """A chat template that yields the fixed pieces around message contents.

    Args:
        source: The Jinja source, or None for `DEFAULT_TEMPLATE`.
        bos_token: Value of `bos_token` in the template.
        eos_token: Value of `eos_token` in the template.

    Raises:
        TemplateError: The template does not compile.
    """

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source if source is not None else DEFAULT_TEMPLATE
        self._template = _compile(self.source)
        self._bos = bos_token
        self._eos = eos_token
        self._frame = lru_cache(maxsize=64)(self._compute_frame)
        self.trims = False
        """True when the template strips whitespace around message contents (Llama 3, Gemma):
        the pieces still frame the prompt, and codectx strips what it controls (turns, the
        question); the repository's system content keeps its final newline."""

    @classmethod
    def usable(cls, source: str | None, bos_token: str = "", eos_token: str = "") -> tuple[ChatTemplate, str | None]:
        """The model's template if prompts can be split from it, else ChatML with a note saying why.

        This is the one fallback for templates codectx cannot frame: the prompt is still
        built by `context` from the workspace's layout (the same files, the same access
        policy), only the chat framing around it changes.
        """
        try:
            template = cls(source, bos_token, eos_token)
            if template.frame(("system", "user"))[0] != template.frame(("system", "user", "assistant", "user"))[0]:
                raise TemplateError("chat template renders the system message differently depending on later turns")
            return template, None
        except TemplateError as err:
            note = f"the model's chat template cannot be split into segments ({err}); prompts use ChatML framing"
            log.warning("%s", note)
            return cls(None, bos_token, eos_token), note

    def render(self, messages: Sequence[tuple[str, str]], add_generation_prompt: bool = True) -> str:
        """The template's text for (role, content) messages.

        Raises:
            TemplateError: The template raised or failed to render.
        """
        msgs = [{"role": role, "content": content} for role, content in messages]
        try:
            return self._template.render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                         bos_token=self._bos, eos_token=self._eos)
        except jinja2.TemplateError as err:
            raise TemplateError(f"chat template failed to render: {err}") from err

    def frame(self, roles: Sequence[str]) -> tuple[str, ...]:
        """The fixed pieces for messages with these roles (len(roles) + 1 pieces).

        Raises:
            TemplateError: The template drops, repeats, reorders or rewrites contents,
                so the prompt cannot be split into stable segments.
        """
        return self._frame(tuple(roles))

    def _compute_frame(self, roles: tuple[str, ...]) -> tuple[str, ...]:
        sentinels = [_SENTINEL.format(i) for i in range(len(roles))]
        text = self.render(list(zip(roles, sentinels)))
        pieces: list[str] = []
        rest = text
        for sentinel in sentinels:
            head, found, rest = rest.partition(sentinel)
            if not found or sentinel in rest:
                raise TemplateError("chat template does not render each message content exactly once, in order")
            pieces.append(head)
        pieces.append(rest)
        probes = [_PROBES[i % len(_PROBES)] for i in range(len(roles))]
        rendered = self.render(list(zip(roles, probes)))
        if rendered == _join(pieces, probes):
            return tuple(pieces)
        if rendered == _join(pieces, [p.strip() for p in probes]):
            self.trims = True
            return tuple(pieces)
        raise TemplateError("chat template rewrites message contents; segments cannot be split from it")

    def content(self, text: str) -> str:
        """A message content as the template will show it (stripped when the template trims)."""
        return text.strip() if self.trims else text


def _join(pieces: Sequence[str], contents: Sequence[str]) -> str:
    return pieces[0] + "".join(c + p for c, p in zip(contents, pieces[1:]))
