"""pytest-lsp harness: the real `codectx serve` over stdio with a tiny random-weight model."""
from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.engine.tiny_models import build_tiny_model
from tests.server.harness import collect_streams, default_options, server_config, start


SAMPLE_UTIL = '''"""Helpers."""


def add(a, b):
    """Returns a + b."""
    return a + b


def greet(name: str) -> str:
    return "Grüße, " + name + " 🙂"
'''
SAMPLE_MAIN = '''from util import add, greet


def main():
    print(greet("café"), add(1, 2))
'''


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model"), hidden_size=64, num_hidden_layers=2,
                            intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture()
def workspace(tmp_path) -> Path:
    (tmp_path / "util.py").write_text(SAMPLE_UTIL, encoding="utf-8")
    (tmp_path / "main.py").write_text(SAMPLE_MAIN, encoding="utf-8")
    return tmp_path


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
