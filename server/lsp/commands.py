"""The `codectx.*` commands: ask, status, showContext, reset, reindex.

`status` and `reset` answer in both phases; the others wait for the model.
"""
from __future__ import annotations

import asyncio
from typing import Any


from context.focus_query import FocusQuery
from server.core.features import ask as ask_feature
from server.core.features import status as status_feature
from server.core.features.symbols import identifier_at
from server.core.prompt import segment_rows
from server.core.question import check_question
from server.core.session import Session

from . import convert, editing
from .errors import InvalidArgumentsError, user_message
from .stream import TextStream


def register(server: Any) -> None:
    """Registers the commands on `server` (a `CodectxServer`)."""
    server.command("codectx.ask")(ask_command)

    @server.command("codectx.status")
    def status_command(ls, *args: Any) -> dict:
        failure = ls.host.load_failure()
        return status_feature.status(ls.base, ls.host.ready_now(), ls.base.documents.encoding.value,
                                     {"pendingRequests": ls.protocol.pending_requests(),
                                      "progressTokens": ls.protocol.progress_tokens()},
                                     user_message(failure) if failure is not None else None)

    @server.command("codectx.showContext")
    async def show_context_command(ls, *args: Any) -> dict:
        """`codectx.showContext {question?, uri?, range?}`: the layout, and the focus an ask with
        that question (and selection or cursor) would get."""
        options = _command_args(args)
        _check_option(options, "question", str, lambda v: bool(v.strip()), "a non-empty string")
        session = await ls.ready()
        focus, prompt = None, session.prompt
        prefix = await prompt.call(prompt.prefix_segments)  # applies the edits (a fold takes seconds): off the loop
        if options.get("question"):
            _, _, query = _selection(session, options, options["question"])
            focus = await prompt.call(prompt.focus, query, session.settings.focus.budget_tokens)
        return status_feature.show_context(session, segment_rows(prefix), session.warmup.segment_states(prefix), focus)

    @server.command("codectx.reset")
    def reset_command(ls, *args: Any) -> dict:
        ls.base.conversations.reset()
        return {"reset": True}

    @server.command("codectx.reindex")
    async def reindex_command(ls, *args: Any) -> dict:
        session = await ls.ready()
        return {"files": await session.reindex()}


async def ask_command(ls: Any, *args: Any) -> dict:
    """`codectx.ask {question, maxTokens?, conversationId?, tools?, uri?, range?}`: streams the
    answer (`codectx/stream`, `$/progress`) and returns it with its metrics."""
    options = _command_args(args)
    question = options.get("question")
    if not isinstance(question, str):
        raise InvalidArgumentsError("codectx.ask needs a non-empty string 'question'")
    check_question(question)
    _check_option(options, "maxTokens", int, lambda v: v >= 1, "a positive integer")
    _check_option(options, "conversationId", str, lambda v: bool(v), "a non-empty string")
    _check_option(options, "tools", bool, lambda v: True, "true or false")
    stream = TextStream(ls, ls.protocol.msg_id, "ask", ls.supports_progress(),
                        client_token=ls.protocol.work_done_token)
    reason = "error"
    try:  # every ask taken ends its stream, also one cancelled or failed while the model loads
        session = await ls.ready()
        selection, path, focus = _selection(session, options, question)
        await stream.begin("codectx: answering")
        result = await ask_feature.ask(
            session, question, on_text=stream.send, on_prefill=stream.prefill, conversation_id=options.get("conversationId"), selection=selection, path=path,
            tools=session.tools if options.get("tools", True) else None, max_tokens=options.get("maxTokens"),
            focus=focus)
        reason = result.finish_reason
        return result.as_dict()
    except asyncio.CancelledError:
        reason = "cancelled"
        raise
    finally:
        stream.end(reason)


def _command_args(args: tuple) -> dict:
    if len(args) > 1 or (args and not isinstance(args[0], dict)):
        raise InvalidArgumentsError("codectx commands take one object argument")
    return dict(args[0]) if args else {}


def _check_option(options: dict, name: str, kind: type, valid: Any, what: str) -> None:
    """Raises InvalidArgumentsError unless `options[name]` is absent/null or a valid `kind`."""
    value = options.get(name)
    if value is None:
        return
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or not valid(value):
        raise InvalidArgumentsError(f"'{name}' must be {what}, got {value!r}")


def _selection(session: Session, options: dict, question: str) -> tuple[str | None, str | None, FocusQuery]:
    """The selected text, its path and what the ask is about, from optional 'uri' + 'range'
    arguments: the selection's file and lines, or for an empty range the identifier there."""
    if "uri" not in options or "range" not in options:
        return None, None, FocusQuery(question)
    _, text, rng = editing.document_range(session, options)
    span = convert.to_span(text, rng, session.documents.encoding)
    found = convert.file_path(options["uri"])  # (a file `document_range` read: a file URI)
    path = str(found) if found else None
    if span.start == span.end:
        found = identifier_at(text, span.start)
        return "", path, FocusQuery(question, symbol=found[0] if found else None, path=path)
    lines = (rng.start.line + 1, rng.end.line + 1 - (rng.end.character == 0 and rng.end.line > rng.start.line))
    return text[span.start:span.end], path, FocusQuery(question, path=path, lines=lines)
