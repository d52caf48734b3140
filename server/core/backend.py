"""Loading the model and starting the engine from settings (runs off the event loop).

The only server module that imports MLX (lazily, inside its functions).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .settings import Settings, WindowSettings

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
    from engine.engine import Engine
    from engine.loading import load_model

    loaded = load_model(settings.model.name, progress=False)
    memory = settings.memory
    engine = Engine(loaded, kv_bits=settings.model.kv_bits, prefill_chunk=settings.model.prefill_chunk,
                    checkpoint_budget_bytes=memory.checkpoint_bytes,
                    archive_bytes=memory.archive_bytes if memory.archive_enabled else 0,
                    speculation=settings.model.speculation, window=window_policy(settings.window))
    logger.info("engine started on %s", loaded.model_id)
    return Backend(engine, loaded.tokenizer, loaded.model_id)


def window_policy(window: WindowSettings) -> Any:
    """The engine's `WindowPolicy` for the `window.*` settings (disabled: exact attention)."""
    from engine.window import WindowPolicy

    return WindowPolicy(enabled=window.enabled, global_tokens=window.global_tokens,
                        window_tokens=window.window_tokens, dense_tail=window.dense_tail_tokens,
                        continuation_tail=window.continuation_tail_tokens)
