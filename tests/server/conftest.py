"""pytest-lsp harness: the real `codectx serve` over stdio with a tiny random-weight model.

`client` (once per client kind), `vscode_client` and `raw_client` start a server of
their own for one test; `shared` (and `shared_each_kind`, once per client kind) is the
run's server, shared by the tests that mark themselves `SHARED` (they run on the
session's event loop; see tests/server/shared_server.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.server.harness import (build_server_test_model, collect_streams, default_options, end_session, server_config,
                                  start, write_sample_workspace)
from tests.server.shared_server import SharedServers

KINDS = ["vscode", "neovim"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_server_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture()
def workspace(tmp_path) -> Path:
    return write_sample_workspace(tmp_path)


@pytest_lsp.fixture(config=server_config(), params=KINDS)
async def client(request, lsp_client: LanguageClient, tiny_model, workspace):
    """A server of its own, initialized with `kind` capabilities and the tiny model."""
    await _start_own(request.param, lsp_client, tiny_model, workspace)
    yield
    await end_session(lsp_client)


@pytest_lsp.fixture(config=server_config())
async def vscode_client(lsp_client: LanguageClient, tiny_model, workspace):
    """A server of its own, initialized with VS Code's capabilities and the tiny model
    (for tests where the client kind does not matter)."""
    await _start_own("vscode", lsp_client, tiny_model, workspace)
    yield
    await end_session(lsp_client)


async def _start_own(kind: str, lsp_client: LanguageClient, tiny_model: Path, workspace: Path) -> None:
    lsp_client.streams = collect_streams(lsp_client)
    lsp_client.kind = kind
    lsp_client.root = workspace
    lsp_client.init_result = await start(lsp_client, kind, workspace, default_options(tiny_model))


@pytest_lsp.fixture(config=server_config())
async def raw_client(lsp_client: LanguageClient, tiny_model, workspace):
    """A started but uninitialized server; the test initializes it."""
    lsp_client.streams = collect_streams(lsp_client)
    lsp_client.root = workspace
    yield
    await end_session(lsp_client)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def shared_servers(tiny_model, tmp_path_factory):
    servers = SharedServers(tiny_model, tmp_path_factory.mktemp("shared"))
    yield servers
    await servers.close()


@pytest_asyncio.fixture(loop_scope="session")
async def shared(shared_servers) -> LanguageClient:
    """The run's loaded server with VS Code's capabilities."""
    return await shared_servers.client("vscode")


@pytest_asyncio.fixture(loop_scope="session", params=KINDS)
async def shared_each_kind(request, shared_servers) -> LanguageClient:
    """The run's loaded server of each client kind (where the position encoding matters)."""
    return await shared_servers.client(request.param)


@pytest.fixture
def llama(default_model_path):
    """llama.cpp's `llama-server` on the default model's GGUF, on loopback: (process, API root)."""
    from engine.default_model import GGUF_NAME
    from tests.server.remote_servers import start_llama_server

    process, url = start_llama_server(default_model_path / GGUF_NAME)
    try:
        yield process, url
    finally:
        process.kill()
        process.wait(timeout=30)


@pytest.fixture
def mlx_server(tiny_model):
    """`mlx_lm.server` on the tiny test model, on loopback: (process, API root)."""
    from tests.server.remote_servers import start_mlx_server

    process, url = start_mlx_server(tiny_model)
    try:
        yield process, url
    finally:
        process.kill()
        process.wait(timeout=30)
