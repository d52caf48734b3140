"""One real `codectx serve` per client kind, shared by the end-to-end tests of a run.

Starting a server process and loading the model costs about two seconds; most
end-to-end tests need a loaded server, not a new one. `SharedServers` starts
one server per client kind on first use (over its own sample workspace), waits
until the model is loaded (the load progress is kept in `load_reports`) and
ends them when the run is done. Tests that share a server leave it as they
found it: they close the documents they open and remove the files they add;
counters they check are counted from what status said before they started; and
only tests/server/test_editing.py hovers there (a hover answer stays cached).
Tests that need a server of their own (start-up options, shutdown) use the
function-scoped `client` fixtures instead.

A test on a shared server is marked `SHARED`: it runs on the session's event
loop, where the servers' clients live.
"""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.server.harness import collect_streams, default_options, server_config, start, write_sample_workspace


SHARED = pytest.mark.asyncio(loop_scope="session")
LOAD_TIMEOUT_S = 120  # a loaded 2-core machine loads the tiny model in seconds


class SharedServers:
    """Lazily started servers, one per client kind ("vscode", "neovim").

    Args:
        model: The tiny model directory the servers load.
        root: A folder for the servers' workspaces (one subfolder per kind).
    """

    def __init__(self, model: Path, root: Path) -> None:
        self.model = model
        self.root = root
        self._clients: dict[str, LanguageClient] = {}

    async def client(self, kind: str) -> LanguageClient:
        """The loaded server of `kind`, with the streams and messages it collected so far forgotten."""
        client = self._clients.get(kind)
        if client is None:
            client = self._clients[kind] = await self._start(kind)
        client.streams.clear()
        client.messages.clear()
        return client

    async def _start(self, kind: str) -> LanguageClient:
        client = await server_config().start()
        client.streams = collect_streams(client)
        client.kind = kind
        client.root = self.root / kind
        client.root.mkdir()
        write_sample_workspace(client.root)
        client.init_result = await start(client, kind, client.root, default_options(self.model))
        client.load_reports = await asyncio.wait_for(_load_reports(client), LOAD_TIMEOUT_S)
        return client

    async def close(self) -> None:
        """Shuts every server down (LSP `shutdown` and `exit`) and stops the clients."""
        for client in self._clients.values():
            with contextlib.suppress(Exception):  # a test that broke its server reports that itself
                await client.shutdown_session()
            await client.stop()
        self._clients.clear()


async def _load_reports(client: LanguageClient) -> list:
    """Waits until the model is loaded; returns the load's progress reports (begin ... end)."""
    def load() -> list:
        return next((reports for token, reports in client.progress_reports.items()
                     if str(token).startswith("codectx-load")), [])
    while not load() or load()[-1].kind != "end":
        await client.wait_for_notification(types.PROGRESS)
    return list(load())


def close_document(client: LanguageClient, path: Path) -> None:
    """Sends didClose for `path` (the server reads the file from disk again)."""
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=path.as_uri())))
