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
from datetime import datetime, timezone
from functools import lru_cache
from typing import Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from context.errors import TemplateError

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
        expected = pieces[0] + "".join(p + q for p, q in zip(probes, pieces[1:]))
        if self.render(list(zip(roles, probes))) != expected:
            raise TemplateError("chat template rewrites message contents (strip/trim?); "
                                "segments cannot be split from it")
        return tuple(pieces)
