"""Fixtures for tests/security: the tiny model and a workspace, built once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.security.http_process import build_model, write_workspace


@pytest.fixture(scope="session")
def security_model(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("security-model"))


@pytest.fixture(scope="session")
def security_workspace(tmp_path_factory) -> Path:
    return write_workspace(tmp_path_factory.mktemp("security-workspace"))
