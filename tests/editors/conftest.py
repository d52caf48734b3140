"""Models the editor suites share."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def looping_model(tmp_path_factory) -> Path:
    """The editor suites' tiny llama shape at weight scale 1.0: its greedy answers loop, so the
    loop guard stops them (tests/server/test_loop_guard_server.py builds the same model)."""
    return build_tiny_model(tmp_path_factory.mktemp("looping-model"), weight_scale=1.0, hidden_size=64,
                            num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
                            num_key_value_heads=1)
