"""The language server: the pygls server over one `SessionHost`, and its lifecycle handlers.

Document sync lives in `sync.py`, the `codectx.*` commands in `commands.py`,
hover and code actions in `editing.py`; the features themselves in
`server.core.features`.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable, TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from server.core.host import SessionHost
from server.core.ready import ReadySession
from server.core.session import LoadingSession, empty_root
from server.core.settings import Settings, parse_settings

from . import commands, convert, editing, sync
from .client_log import ClientLogHandler
from .documents import DocumentStore
from .errors import user_message
from .protocol import CodectxProtocol
from .stream import TextStream

logger = logging.getLogger(__name__)
WARMTH_METHOD = "codectx/warmth"
T = TypeVar("T")


class CodectxServer(LanguageServer):
    """pygls server holding one `SessionHost` (replaced at `initialize`)."""

    def __init__(self) -> None:
        super().__init__("codectx", "0.1.0", protocol_cls=CodectxProtocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.host = SessionHost(LoadingSession(Settings(), DocumentStore(convert.UTF16), Path.cwd()))
        self.settings_problems: list[str] = []
        self.shown_problems: list[str] = []  # (the same problems again, say at Neovim's start-up, are not shown again)
        self.start_up_task: asyncio.Task | None = None
        self.client_log: ClientLogHandler | None = None
        """Set by `codectx serve`: log records go to the client from `initialize` on."""

    @property
    def base(self) -> LoadingSession:
        """The session's loading phase (settings, buffers, root): there from `initialize` on."""
        return self.host.base

    def show(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def supports_progress(self) -> bool:
        window = self.client_capabilities.window
        return bool(window and window.work_done_progress)

    def offers_restart(self) -> bool:
        """The client offers a restart itself when settings that need one change (client capability
        ``experimental.codectx.restartOffer``, docs/protocol.md): the server's message would be a second notice."""
        experimental = self.client_capabilities.experimental
        codectx = experimental.get("codectx") if isinstance(experimental, dict) else None
        return isinstance(codectx, dict) and codectx.get("restartOffer") is True

    async def ready(self) -> ReadySession:
        """Waits for the model to load; raises its load error if it failed."""
        return await self.host.ready()

    def current(self) -> ReadySession | None:
        """`SessionProvider` for HTTP beside the editor: the ready session or None."""
        return self.host.current()

    async def call(self, fn: Callable[[ReadySession], T]) -> T:
        """`SessionProvider`: `fn(ready session)` on the session's prompt thread, started from the language server's
        loop (`SessionHost.call`)."""
        return await self.host.call(fn)

    async def start_up(self) -> None:
        """After `initialized`: settings from the client, then the model."""
        if self.base.no_folder:
            self.show("codectx: no workspace folder is open, so answers see no repository files; open a folder "
                      "for codectx to read it", types.MessageType.Info)
        try:
            await self.fetch_configuration()
            await self.load()
        except Exception as err:  # noqa: BLE001 - handed to every waiting request
            self.host.failed(err)

    async def fetch_configuration(self) -> None:
        """Merges `workspace/configuration` (section codectx) over initializationOptions."""
        workspace = self.client_capabilities.workspace
        if workspace and workspace.configuration:
            configs = await self.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="codectx")]))
            if configs and configs[0]:  # it replaces initializationOptions: so do its problems
                settings, self.settings_problems = parse_settings(configs[0])
                kept = self.host.apply_settings(settings)
                if kept and not self.offers_restart():
                    self.show(f"codectx: {', '.join(f'{name}.*' for name in kept)} settings changed; restart the "
                              "server to use them (the running engine keeps the old ones)", types.MessageType.Info)
        if self.settings_problems and self.settings_problems != self.shown_problems:
            self.show("codectx: invalid settings, using defaults for: " + "; ".join(self.settings_problems))
        self.shown_problems = list(self.settings_problems)

    async def load(self) -> None:
        """Loads the model and scans the workspace (progress shown), then warm-up starts."""
        stream = TextStream(self, None, "load", self.supports_progress(), notify=False)
        await stream.begin("codectx: loading model", cancellable=False)  # a cancelled load would leave no model
        try:
            ready = await self.host.load(stage=stream.stage)
        except Exception as err:
            stream.end("error")
            self.show(user_message(err), types.MessageType.Error)
            raise
        archive = ready.backend.archive_problem()
        if archive is not None:  # the engine goes on with checkpoints in memory
            self.show(f"codectx: checkpoint archive {archive}; answers still work, a restart recomputes the prefix")
        stream.end("ready")

    def on_warmth(self, state: dict) -> None:
        """Sends `codectx/warmth` (warm-up state + prepared hovers)."""
        self.protocol.notify(WARMTH_METHOD, state)


server = CodectxServer()
editing.register(server)
sync.register(server)
commands.register(server)


@server.feature(types.INITIALIZE)
def initialize(ls: CodectxServer, params: types.InitializeParams) -> None:
    settings, ls.settings_problems = parse_settings(params.initialization_options)
    root = params.root_uri or (params.workspace_folders[0].uri if params.workspace_folders else None)
    encoding = convert.choose_encoding(params.capabilities)
    # No folder open: an empty one of ours, not the server's working directory (often the home folder).
    folder = convert.file_path(root) if root else None
    base = LoadingSession(settings, DocumentStore(encoding), folder or empty_root())
    base.no_folder = folder is None
    ls.host = SessionHost(base, ls.on_warmth)
    ls.host.begin()
    if ls.client_log is not None:
        ls.client_log.attach(asyncio.get_running_loop())


@server.feature(types.INITIALIZED)
def initialized(ls: CodectxServer, params: types.InitializedParams) -> None:
    if ls.start_up_task is not None:  # once: another would load (and hold) a second model
        logger.warning("initialized sent again: ignored")
        return
    ls.start_up_task = asyncio.ensure_future(ls.start_up())


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: CodectxServer, params: types.DidChangeConfigurationParams) -> None:
    ls.settings_problems = []
    await ls.fetch_configuration()


@server.feature(types.SHUTDOWN)
def shutdown(ls: CodectxServer, *args: Any) -> None:
    ls.host.shutdown()


@server.feature(types.EXIT)
def exit_(ls: CodectxServer, *args: Any) -> None:
    """`exit` or end of input (`CodectxProtocol.finish`), with or without `shutdown` before."""
    if ls.start_up_task is not None:
        ls.start_up_task.cancel()
    ls.host.close()
