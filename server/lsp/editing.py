"""Handlers for hover, code actions and `codectx.findBugs` (thin: convert, call, convert).

While the model loads a hover shows the static card (signature, docstring) of a definition
in the same file; code actions and commands wait for the model.
"""
from __future__ import annotations

from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path

from context.errors import ContextError

from . import convert
from .errors import InvalidArgumentsError
from server.core.features import code_actions, hover
from server.core.features.code_actions import ACTIONS
from server.core.features.symbols import identifier_at
from server.core.outcomes import counted_as
from server.core.session import LoadingSession, Session

ACTION_KINDS = {"explain": "source.codectx.explain", "docstring": types.CodeActionKind.RefactorRewrite.value,
                "findBugs": "source.codectx.findBugs", "tests": "source.codectx.tests",
                "ask": "source.codectx.ask"}


def register(server: Any) -> None:
    """Registers the editor features on `server` (a `CodectxServer`)."""
    _register_hover(server)
    _register_code_actions(server)


def _register_hover(server: Any) -> None:
    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def on_hover(ls, params: types.HoverParams) -> types.Hover | None:
        session = ls.host.ready_now()
        reader = session if session is not None else ls.base  # while loading: the static card
        if not reader.settings.hover.enabled:
            return None
        try:
            text = document_text(reader, params.text_document.uri)
        except InvalidArgumentsError:
            return None  # not a file codectx reads: no explanation, and no error popup
        offset = convert.to_offset(text, params.position, reader.documents.encoding)
        found = identifier_at(text, offset)
        if found is None:
            return None
        name, span = found
        path = convert.file_path(params.text_document.uri)
        if path is None:  # not a file (an untitled buffer, a relative file URI): nothing to explain it from
            return None
        if session is None:
            answer = ls.host.static_hover(name, path)
        else:
            with counted_as("hover"):  # the model request behind it is counted by its outcome
                answer = await hover.explain(session, session.hover_cache, name, path, session.prompt.files,
                                             params.position.line + 1)
        ls.host.focus(path, params.position.line + 1)
        if answer is None:
            return None
        return convert.markdown_hover(answer.markdown, text, span, reader.documents.encoding)


def _register_code_actions(server: Any) -> None:
    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(resolve_provider=True))
    def on_code_action(ls, params: types.CodeActionParams) -> list[types.CodeAction]:
        path = convert.file_path(params.text_document.uri)
        if path is None or ls.base.name_refusal(path) is not None:
            return []  # not a workspace file codectx reads (untitled:, git:, outside, a secret): nothing it could do
        data = {"uri": params.text_document.uri,
                "range": convert.range_to_json(params.range)}
        return [convert.code_action(title, dict(data, action=name), ACTION_KINDS[name])
                for name, title in ACTIONS.items()]

    @server.feature(types.CODE_ACTION_RESOLVE)
    async def on_resolve(ls, action: types.CodeAction) -> types.CodeAction:
        if not isinstance(action.data or {}, dict):
            raise InvalidArgumentsError("codeAction/resolve: 'data' must be the object codectx sent")
        data = dict(action.data or {})
        name, arguments = data.get("action"), {"uri": data.get("uri"), "range": data.get("range")}
        if name == "explain":
            action.command = types.Command(title=action.title, command="codectx.ask",
                                           arguments=[dict(arguments, question="Explain the selected code.")])
        elif name == "ask":
            action.command = types.Command(title=action.title, command="codectx.askAboutSelection",
                                           arguments=[arguments])
        elif name == "findBugs":
            action.command = types.Command(title=action.title, command="codectx.findBugs", arguments=[arguments])
        elif name in ("docstring", "tests"):
            action.edit = await _edit_for(await ls.ready(), name, data)
        else:
            raise InvalidArgumentsError(f"unknown codectx code action {name!r}")
        return action

    @server.command("codectx.findBugs")
    async def find_bugs_command(ls, *args: Any) -> dict:
        options = args[0] if args and isinstance(args[0], dict) else {}
        session = await ls.ready()
        uri, text, rng = document_range(session, options)
        encoding = session.documents.encoding
        span = convert.to_span(text, rng, encoding)
        bugs = await code_actions.find_bugs(session, text[span.start:span.end], rng.start.line)
        lines = text.splitlines() or [""]
        diagnostics = [convert.diagnostic(text, _line_span(text, lines, line), message, encoding)
                       for line, message in bugs]
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics))
        return {"diagnostics": len(diagnostics)}


async def _edit_for(session: Session, name: str, data: dict) -> types.WorkspaceEdit | None:
    uri, text, rng = document_range(session, data)
    path = convert.file_path(uri)  # (a file URI: `document_range` read it)
    if name == "docstring":
        insertion = await code_actions.docstring_insertion(session, path, text, rng.start.line + 1)
    else:
        try:
            insertion = await code_actions.tests_insertion(session, session.root, path, text, rng.start.line + 1)
        except ContextError as err:
            raise InvalidArgumentsError(f"codectx proposes no edit to {err}") from err
    if insertion is None:
        return None
    # The document's own URI as the editor spelled it (`a(1)+b.py` unescaped, say), so the edit names that
    # buffer and its version; another file's, spelled here.
    target_uri = uri if insertion.path == path else from_fs_path(str(insertion.path))
    target_text = text if insertion.path == path else ("" if insertion.create else document_text(session, target_uri))
    doc = session.documents.get(target_uri)
    return convert.insertion_edit(target_uri, target_text, insertion.line, insertion.column, insertion.text,
                                  session.documents.encoding, doc.version if doc else None, insertion.create)


def document_range(session: Session, options: dict) -> tuple[str, str, types.Range]:
    """(uri, text, range) from command arguments `{"uri", "range"}`.

    Raises:
        InvalidArgumentsError: Missing or malformed arguments, or an unreadable file.
    """
    try:
        uri = options["uri"]
        rng = convert.range_from_json(options["range"])
    except Exception as err:  # noqa: BLE001 - any malformed argument is the caller's error
        raise InvalidArgumentsError(f"expected 'uri' and 'range' of an open or readable file: {err}") from err
    return uri, document_text(session, uri), rng


def document_text(session: Session | LoadingSession, uri: Any) -> str:
    """The text of a document (open buffer, else disk) through the workspace's access policy.

    Raises:
        InvalidArgumentsError: Not a file URI, or a file the policy refuses (outside the
            workspace, a secret, ignored, ...); the message says why.
    """
    path = convert.file_path(uri) if isinstance(uri, str) else None
    if path is None:
        raise InvalidArgumentsError(f"not a file URI with an absolute path: {uri!r}")
    try:
        return session.read_text(path)
    except ContextError as err:
        raise InvalidArgumentsError(f"codectx does not read {err}") from err


def _line_span(text: str, lines: list[str], line: int) -> convert.Span:
    start = convert.to_offset(text, types.Position(line, 0), convert.UTF32)
    return convert.Span(start, start + len(lines[min(line, len(lines) - 1)]))
