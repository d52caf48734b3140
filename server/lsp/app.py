"""The language server: handler registration only. Features live in `features/`."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from server.core.backend import start_backend
from server.core.features import ask as ask_feature
from server.core.features import hover as hover_feature
from server.core.features import status as status_feature
from server.core.features.hover_prefetch import HoverPrefetch
from server.core.prompt import WorkspacePrompt
from server.core.session import Session
from server.core.settings import Settings, parse_settings
from server.core.tools import TOOLS_PROMPT, WorkspaceTools
from server.core.warmup import Warmup

from . import convert, editing
from .documents import DocumentStore
from .errors import InvalidArgumentsError, NotReadyError, user_message
from .protocol import CodectxProtocol
from .stream import TextStream

logger = logging.getLogger(__name__)
WARMTH_METHOD = "codectx/warmth"
T = TypeVar("T")


class CodectxServer(LanguageServer):
    """pygls server holding one `Session`."""

    def __init__(self) -> None:
        super().__init__("codectx", "0.1.0", protocol_cls=CodectxProtocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.session = Session(Settings(), DocumentStore(convert.UTF16), None)
        self.conversations = ask_feature.Conversations()
        self.loaded: asyncio.Future | None = None
        self.warmup: Warmup | None = None
        self.hover_cache = hover_feature.HoverCache(self.read_text)
        self.prefetch: HoverPrefetch | None = None
        self.early_focus: tuple[Path, int] | None = None
        self.tools: WorkspaceTools | None = None
        self.settings_problems: list[str] = []
        self.start_up_task: asyncio.Task | None = None
        self.session_loop: asyncio.AbstractEventLoop | None = None  # set by `initialize`

    def show(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def supports_progress(self) -> bool:
        window = self.client_capabilities.window
        return bool(window and window.work_done_progress)

    async def ready_session(self) -> Session:
        """Waits for the model to load; raises its load error if it failed."""
        if self.loaded is None:
            self.session.require_ready()
        await asyncio.shield(self.loaded)
        return self.session

    async def start_up(self) -> None:
        """After `initialized`: settings from the client, then the model (sets `loaded`)."""
        try:
            await self.fetch_configuration()
            await self.load()
        except Exception as err:  # noqa: BLE001 - handed to every waiting request
            self.loaded.set_exception(err)
        else:
            self.loaded.set_result(None)

    async def fetch_configuration(self) -> None:
        """Merges `workspace/configuration` (section codectx) over initializationOptions."""
        workspace = self.client_capabilities.workspace
        if workspace and workspace.configuration:
            configs = await self.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="codectx")]))
            if configs and configs[0]:
                settings, problems = parse_settings(configs[0])
                self.session.settings = settings
                self.settings_problems += problems
        if self.settings_problems:
            self.show("codectx: invalid settings, using defaults for: " + "; ".join(self.settings_problems))

    async def load(self) -> None:
        """Loads the model, builds the prompt layout and starts warm-up (background)."""
        stream = TextStream(self, None, "load", self.supports_progress(), notify=False)
        await stream.begin("codectx: loading model")
        try:
            backend = await asyncio.to_thread(start_backend, self.session.settings)
            stream.stage(f"scanning {self.session.root}")
            prompt = await asyncio.to_thread(self.make_prompt, backend.tokenizer)
        except Exception as err:
            stream.end("error")
            self.show(user_message(err), types.MessageType.Error)
            raise
        self.session.attach(backend, prompt)
        archive = backend.archive_problem()
        if archive is not None:  # the engine goes on with checkpoints in memory
            self.show(f"codectx: checkpoint archive {archive}; answers still work, a restart recomputes the prefix")
        self.tools = WorkspaceTools(prompt.access, self.read_text, lambda: prompt.files)
        self.warmup = Warmup(self.session, self.on_warmth,
                             lead_in=hover_feature.lead_in if self.session.settings.hover.enabled else None)
        self.prefetch = HoverPrefetch(self.session, self.hover_cache, busy=lambda: self.warmup.busy,
                                      on_prepared=lambda: self.on_warmth(self.warmup.state()))
        self.session.interactive_hooks = (self.prefetch.interactive_started, self.prefetch.interactive_done)
        if self.early_focus is not None:
            self.prefetch.focus = self.early_focus  # prepared once the start-up warm-up is done
        stream.end("ready")
        self.warmup.schedule(0)

    def on_warmth(self, state: dict) -> None:
        """Sends `codectx/warmth` (warm-up state + prepared hovers); idle again: prepare hovers."""
        self.protocol.notify(WARMTH_METHOD, dict(state, hoverPrefetch=self.prefetch.state()))
        # Called from inside the warm-up task: look again once that task has ended.
        asyncio.get_running_loop().call_soon(self._kick_if_idle)

    def _kick_if_idle(self) -> None:
        if self.warmup is not None and not self.warmup.busy:
            self.prefetch.kick()

    def focus(self, path: Path | None, line: int) -> None:
        """The user works at `path`:`line` (1-based): prepare hovers there (see `HoverPrefetch`).
        Before the model is loaded (editors open documents at once) it is kept for later."""
        if path is None or not self.session.settings.hover.enabled:
            return
        if self.prefetch is None:
            self.early_focus = (path, line)
        else:
            self.prefetch.focus_on(path, line)

    def current(self) -> Session | None:
        """The session once loaded, else None (`SessionProvider`, for HTTP beside the editor)."""
        return self.session if self.session.ready else None

    async def call(self, fn: Callable[[Session], T]) -> T:
        """`fn(session)` on the language server's loop (`SessionProvider`).

        Raises:
            NotReadyError: The session is not loaded.
        """
        loop = self.session_loop
        if loop is None:
            raise NotReadyError("codectx is still loading the model; try again in a moment")

        async def run() -> T:
            self.session.require_ready()
            return fn(self.session)

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), loop))

    def make_prompt(self, tokenizer: Any) -> WorkspacePrompt:
        """The workspace's prompt (context owns the chat-template fallback and the access policy)."""
        return WorkspacePrompt(self.session.root, tokenizer, self.session.buffer_text, TOOLS_PROMPT,
                               self.session.settings.context)

    def mark_dirty(self, uri: str) -> None:
        """An open buffer or a file changed: the prompt picks it up next time."""
        path = to_fs_path(uri)
        self.session.prefix_version += 1
        if self.session.prompt is not None and path:
            self.session.prompt.mark_dirty(Path(path))

    def read_text(self, path: Path) -> str:
        """A file's current text (open buffer, else disk) through the workspace's access policy.

        Raises:
            ContextError: The policy refuses the file, or the workspace is not scanned yet.
        """
        return self.session.read_text(path)


server = CodectxServer()
editing.register(server)


def _command_args(args: tuple) -> dict:
    if len(args) > 1 or (args and not isinstance(args[0], dict)):
        raise InvalidArgumentsError("codectx commands take one object argument")
    return dict(args[0]) if args else {}


@server.feature(types.INITIALIZE)
def initialize(ls: CodectxServer, params: types.InitializeParams) -> None:
    settings, ls.settings_problems = parse_settings(params.initialization_options)
    root = params.root_uri or (params.workspace_folders[0].uri if params.workspace_folders else None)
    encoding = convert.choose_encoding(params.capabilities)
    ls.session = Session(settings, DocumentStore(encoding), Path(to_fs_path(root)) if root else Path.cwd())
    ls.session_loop = asyncio.get_running_loop()
    ls.loaded = ls.session_loop.create_future()
    ls.loaded.add_done_callback(lambda f: f.cancelled() or f.exception())  # also raised to requests


@server.feature(types.INITIALIZED)
def initialized(ls: CodectxServer, params: types.InitializedParams) -> None:
    ls.start_up_task = asyncio.ensure_future(ls.start_up())


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: CodectxServer, params: types.DidOpenTextDocumentParams) -> None:
    doc = ls.session.documents.open(params.text_document)
    if ls.session.prompt is not None and doc.path is not None:
        ls.session.prompt.mark_dirty(doc.path)
    ls.focus(doc.path, 1)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: CodectxServer, params: types.DidChangeTextDocumentParams) -> None:
    doc = ls.session.documents.change(params)
    ls.mark_dirty(doc.uri)
    ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=doc.uri, diagnostics=[]))
    if ls.warmup is not None and doc.path is not None:
        ls.warmup.schedule(ls.session.settings.warmup.debounce_ms / 1000, doc.path)
    if ls.prefetch is not None:
        ls.prefetch.interrupt()  # the engine is warm-up's first
        changes = params.content_changes
        line = changes[-1].range.start.line + 1 if changes and hasattr(changes[-1], "range") else 1
        ls.focus(doc.path, line)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: CodectxServer, params: types.DidCloseTextDocumentParams) -> None:
    if ls.session.documents.close(params.text_document.uri) is not None and ls.session.prompt is not None:
        ls.session.prompt.mark_dirty(Path(to_fs_path(params.text_document.uri)))


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: CodectxServer, params: types.DidChangeConfigurationParams) -> None:
    model_before, window_before = ls.session.settings.model, ls.session.settings.window
    ls.settings_problems = []
    await ls.fetch_configuration()
    if ls.session.settings.window != window_before and ls.session.ready:
        ls.session.backend.set_window(ls.session.settings.window)  # from the next request on
    if ls.session.settings.model != model_before and ls.session.ready:
        ls.session.settings = dataclasses.replace(ls.session.settings, model=model_before)
        ls.show("codectx: model settings changed; restart the server to load the new model",
                types.MessageType.Info)


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def did_change_watched(ls: CodectxServer, params: types.DidChangeWatchedFilesParams) -> None:
    for change in params.changes:
        ls.mark_dirty(change.uri)
        path = to_fs_path(change.uri)
        if ls.warmup is not None and path:
            ls.warmup.schedule(ls.session.settings.warmup.debounce_ms / 1000, Path(path))
    if ls.prefetch is not None:
        ls.prefetch.interrupt()


@server.command("codectx.ask")
async def ask_command(ls: CodectxServer, *args: Any) -> dict:
    options = _command_args(args)
    question = options.get("question")
    if not isinstance(question, str) or not question.strip():
        raise InvalidArgumentsError("codectx.ask needs a non-empty string 'question'")
    _check_option(options, "maxTokens", int, lambda v: v >= 1, "a positive integer")
    _check_option(options, "conversationId", str, lambda v: bool(v), "a non-empty string")
    _check_option(options, "tools", bool, lambda v: True, "true or false")
    session = await ls.ready_session()
    selection, path = _selection(ls, options)
    stream = TextStream(ls, ls.protocol.msg_id, "ask", ls.supports_progress(),
                        client_token=ls.protocol.work_done_token)
    await stream.begin("codectx: answering")
    reason = "error"
    try:
        result = await ask_feature.ask(
            session, question, on_text=stream.send, on_prefill=stream.prefill, conversations=ls.conversations,
            conversation_id=options.get("conversationId"), selection=selection, path=path,
            tools=ls.tools if options.get("tools", True) else None, max_tokens=options.get("maxTokens"))
        reason = result.finish_reason
        return result.as_dict()
    except asyncio.CancelledError:
        reason = "cancelled"
        raise
    finally:
        stream.end(reason)


def _check_option(options: dict, name: str, kind: type, valid: Any, what: str) -> None:
    """Raises InvalidArgumentsError unless `options[name]` is absent/null or a valid `kind`."""
    value = options.get(name)
    if value is None:
        return
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or not valid(value):
        raise InvalidArgumentsError(f"'{name}' must be {what}, got {value!r}")


def _selection(ls: CodectxServer, options: dict) -> tuple[str | None, str | None]:
    """The selected text and its path, from optional 'uri' + 'range' arguments."""
    if "uri" not in options or "range" not in options:
        return None, None
    _, text, rng = editing.document_range(ls, options)
    span = convert.to_span(text, rng, ls.session.documents.encoding)
    return text[span.start:span.end], to_fs_path(options["uri"])


@server.command("codectx.status")
def status_command(ls: CodectxServer, *args: Any) -> dict:
    state = status_feature.status(ls.session, ls.warmup, ls.session.documents.encoding.value,
                                  {"pendingRequests": ls.protocol.pending_requests(),
                                   "progressTokens": ls.protocol.progress_tokens()})
    state["hoverPrefetch"] = ls.prefetch.state() if ls.prefetch is not None else None
    return state


@server.command("codectx.showContext")
async def show_context_command(ls: CodectxServer, *args: Any) -> dict:
    return status_feature.show_context(await ls.ready_session(), ls.warmup.segment_states())


@server.command("codectx.reset")
def reset_command(ls: CodectxServer, *args: Any) -> dict:
    ls.conversations.reset()
    return {"reset": True}


@server.command("codectx.reindex")
async def reindex_command(ls: CodectxServer, *args: Any) -> dict:
    await ls.ready_session()
    ls.session.prompt.rescan()
    ls.session.prefix_version += 1
    ls.warmup.schedule(0)
    return {"files": len(ls.session.prompt.files)}


def _stop_background(ls: CodectxServer) -> None:
    """Stops warm-up and hover preparation and cancels engine requests (idempotent)."""
    if ls.warmup is not None:
        ls.warmup.stop()
    if ls.prefetch is not None:
        ls.prefetch.stop()
    if ls.session.backend is not None:
        ls.session.cancel_all()


@server.feature(types.SHUTDOWN)
def shutdown(ls: CodectxServer, *args: Any) -> None:
    _stop_background(ls)


@server.feature(types.EXIT)
def exit_(ls: CodectxServer, *args: Any) -> None:
    """`exit` or end of input (`CodectxProtocol.finish`), with or without `shutdown` before."""
    if ls.start_up_task is not None:
        ls.start_up_task.cancel()
    _stop_background(ls)
    ls.session.close()
