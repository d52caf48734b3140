"""Shared fixtures: a tiny llama model built once per session, loaded by the real loader."""
from __future__ import annotations

import pytest

from engine.engine import Engine
from engine.loading import load_model
from tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny llama directory (2 layers, hidden 128, head_dim 64, vocab 512, float32)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    """The tiny model as `engine.loading.load_model` returns it."""
    return load_model(str(tiny_model_dir), progress=False)


@pytest.fixture
def engine(tiny_loaded):
    """An Engine on the tiny model with small prefill chunks, closed after the test."""
    eng = Engine(tiny_loaded, prefill_chunk=16)
    yield eng
    eng.close()
