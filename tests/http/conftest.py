"""Fixtures for tests/http: the tiny model, a workspace and a running loopback server."""
from __future__ import annotations

from pathlib import Path

import pytest

from server.http.config import HttpConfig
from tests.http.http_harness import (MAX_BODY_BYTES, MAX_PROMPT_TOKENS, WORKSPACE_FILES, start_api,
                                     tiny_model_with_template)


@pytest.fixture(scope="session")
def http_model(tmp_path_factory) -> Path:
    return tiny_model_with_template(tmp_path_factory.mktemp("http-model"))


@pytest.fixture(scope="session")
def http_workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("http-workspace")
    for name, text in WORKSPACE_FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def api(http_model, http_workspace, tmp_path_factory):
    """A loopback server without a key, with the repository model."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CODECTX_HOME", str(tmp_path_factory.mktemp("home")))
        running = start_api(http_model, http_workspace,
                            HttpConfig(port=0, max_body_bytes=MAX_BODY_BYTES, max_prompt_tokens=MAX_PROMPT_TOKENS))
        yield running
        running.server.stop()
        running.source.close()
