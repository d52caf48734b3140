"""pytest-lsp harness: the real `codectx serve` over stdio with a tiny random-weight model."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.server.harness import (build_server_test_model, collect_streams, default_options, server_config, start,
                                  write_sample_workspace)




@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_server_test_model(tmp_path_factory.mktemp("model"))


@pytest.fixture()
def workspace(tmp_path) -> Path:
    return write_sample_workspace(tmp_path)


@pytest_lsp.fixture(config=server_config(), params=["vscode", "neovim"])
async def client(request, lsp_client: LanguageClient, tiny_model, workspace):
    """A server initialized with `kind` capabilities and the tiny model."""
    lsp_client.streams = collect_streams(lsp_client)
    lsp_client.kind = request.param
    lsp_client.root = workspace
    lsp_client.init_result = await start(lsp_client, request.param, workspace, default_options(tiny_model))
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=server_config())
async def raw_client(lsp_client: LanguageClient, tiny_model, workspace):
    """A started but uninitialized server; the test initializes it."""
    lsp_client.streams = collect_streams(lsp_client)
    lsp_client.root = workspace
    yield
    await lsp_client.shutdown_session()
