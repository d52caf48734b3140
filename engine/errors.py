"""Errors raised by the engine. The server maps them to user messages in one place."""


class EngineError(Exception):
    """Base class of every engine error."""


class ModelNotFoundError(EngineError):
    """A model name, path or hub id that cannot be resolved."""


class ModelLoadError(EngineError):
    """A model that was found but cannot be loaded (bad file, unsupported architecture)."""


class ChecksumMismatchError(ModelLoadError):
    """A downloaded or cached model file whose SHA-256 does not match the expected one."""


class RequestCancelled(EngineError):
    """The request was cancelled; the engine rolled back to confirmed state."""


class EngineClosedError(EngineError):
    """submit() after close()."""


class DraftModelMismatchError(ModelLoadError):
    """A draft model that cannot draft for the target (different tokenizer, untrimmable cache)."""


class ContextOverflowError(EngineError, ValueError):
    """A request whose prompt and answer (`max_tokens`) would run past the model's trained context:
    refused at `Engine.submit`, before anything runs (the model would answer from positions it never learned)."""
