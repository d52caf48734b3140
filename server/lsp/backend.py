"""Loading the model and starting the engine from settings (runs off the event loop)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .settings import Settings

logger = logging.getLogger(__name__)


@dataclass
class Backend:
    """A started engine and the tokenizer prompts are built with."""

    engine: Any
    tokenizer: Any
    model_id: str


def start_backend(settings: Settings) -> Backend:
    """Loads `settings.model.name` and starts an `Engine` on it (blocking).

    Raises:
        ModelNotFoundError: The model name resolves to nothing.
        ModelLoadError: The model exists but cannot be loaded.
    """
    from engine.engine import Engine  # the only place the server imports MLX
    from engine.loading import load_model

    loaded = load_model(settings.model.name, progress=False)
    memory = settings.memory
    engine = Engine(loaded, kv_bits=settings.model.kv_bits, prefill_chunk=settings.model.prefill_chunk,
                    checkpoint_budget_bytes=memory.checkpoint_bytes,
                    archive_bytes=memory.archive_bytes if memory.archive_enabled else 0,
                    speculation=settings.model.speculation)
    logger.info("engine started on %s", loaded.model_id)
    return Backend(engine, loaded.tokenizer, loaded.model_id)
