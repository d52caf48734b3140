"""The server's settings: one typed, fully defaulted tree.

Settings arrive as `initializationOptions` and from `workspace/configuration`
(section ``codectx``), both in camelCase. `parse_settings` never raises: every
value that is missing or invalid keeps its default and yields a problem string
the server shows once through `window/showMessage`.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from engine.compute_options import (ATTENTION_CHOICES, FORWARD_CHOICES, KERNEL_CHOICES, LINEAR_CHOICES, ROOM_CHOICES,
                                    ComputeOptions)


@dataclass(frozen=True)
class ModelSettings:
    """Which model runs and how.

    Attributes:
        name: `smollm2-135m`, a model directory, a `.gguf` file, a hub id, `ollama:NAME[:TAG]`
            or `lmstudio:PUBLISHER/REPO[/FILE]` (`engine.model_library`).
        kv_bits: 8 for the quantized KV cache, 16 for the model's dtype.
        prefill_chunk: Tokens per prefill forward call.
        speculation: Speculative decoding: "off", "lookup" (prompt lookup), "draft"
            (needs `draft_model`) or "auto" (the draft model if set, else prompt
            lookup, paused while it does not pay).
        draft_model: A small model with the same tokenizer that drafts for
            "draft"/"auto" (a directory, a `.gguf` or a hub id); "" for none.
        gguf_bits: What a GGUF's weights are converted to: 4 (the file's 4-bit grids kept,
            finer tensors at 8), 8 or 16 (float16); `engine.gguf.DEFAULT_GGUF_BITS` is 4.
    """

    name: str = "smollm2-135m"
    kv_bits: int = 16
    prefill_chunk: int = 256
    speculation: str = "auto"
    draft_model: str = ""
    gguf_bits: int = 4


ComputeSettings = ComputeOptions
"""`compute.*`: how the engine computes the model's forward, the engine's own options
(`engine.compute_options.ComputeOptions`: names, defaults and checks held once), parsed like
every group here; what runs is part of the checkpoint policy, so checkpoints of one path are
never restored under another."""


@dataclass(frozen=True)
class WindowSettings:
    """Windowed prefill: an attention policy of the KV cache (engine/window.py; docs/configuration.md).

    Attributes:
        enabled: False gives exact attention everywhere.
        global_tokens: G, the leading positions every prefill query sees.
        window_tokens: W, the recent keys a prefill chunk sees.
        dense_tail_tokens: Positions before the end of the stable segments that stay dense.
        continuation_tail_tokens: Dense positions at the end of a plain token prompt.
    """

    enabled: bool = True
    global_tokens: int = 8192
    window_tokens: int = 8192
    dense_tail_tokens: int = 2048
    continuation_tail_tokens: int = 128


@dataclass(frozen=True)
class ContextSettings:
    """What goes into the stable prefix."""

    budget_tokens: int = 6000
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    """Secret patterns (gitignore syntax) no read reaches, added to `context.access.DEFAULT_DENY`."""


@dataclass(frozen=True)
class MemorySettings:
    """Checkpoint budgets: bytes kept in memory and on disk."""

    checkpoint_bytes: int = 2 * 1024**3
    archive_enabled: bool = True
    archive_bytes: int = 8 * 1024**3


@dataclass(frozen=True)
class HoverSettings:
    """Hover explanations.

    Attributes:
        use_warm_prefix: While edits are not prefilled yet (warm-up waits for
            the user to pause), answer from the last prefilled prefix (the
            repository as the model last read it) and its hover lead-in; when
            the symbol's file changed since, the answer start quotes the
            symbol's current text: the hover then costs only those tokens.
        first_sentence: End the answer after its first sentence (and ask the
            model for one): a hover is read at a glance, and a short answer is
            ready sooner, so more of them are prepared before the user hovers.
        prefetch: Prepare the answers of this many definitions of the file the
            user works in, in reading order from the line last opened, hovered
            or edited, in the background while the engine is idle (0: off).
        prepare_batch: Prepare up to this many of those answers together, as one batch
            over their common lead-in where the engine can (`engine.batch`: the NumPy
            forward shares the weights and the prefix's keys between them); 1 prepares
            them one by one.
        prefetch_heads: Then prefill the answer heads of the 32 nearest
            definitions without a prepared answer (cheap: one short forward
            call each), so a hover on one of them computes one token before its
            first generated one.
    """

    enabled: bool = True
    latency_budget_ms: int = 0
    max_tokens: int = 96
    first_sentence: bool = True
    use_warm_prefix: bool = True
    prefetch: int = 64
    prepare_batch: int = 4
    prefetch_heads: bool = True


@dataclass(frozen=True)
class AskSettings:
    """`codectx.ask` and code actions."""

    max_tokens: int = 512
    max_tool_calls: int = 4


@dataclass(frozen=True)
class FocusSettings:
    """Focus segments (`context.focus`): the definitions and files a request names, from the whole
    repository, after the stable prefix and before the question.

    Attributes:
        enabled: Add focus segments to asks.
        budget_tokens: Most tokens they hold. The default model's context is 8192 tokens: the
            prefix (`context.budgetTokens` 6000) and an answer (`ask.maxTokens` 512) leave 1680;
            1024 of them for the focus leave 656 for the question and earlier turns.
    """

    enabled: bool = True
    budget_tokens: int = 1024


@dataclass(frozen=True)
class WarmupSettings:
    """Background re-prefill after edits."""

    enabled: bool = True
    debounce_ms: int = 750


@dataclass(frozen=True)
class GenerationSettings:
    """How every answer (ask, hover, code action, HTTP) is generated and when it is stopped early.

    Attributes:
        loop_guard: End an answer whose output repeats itself (`engine.loop_guard`: a period
            of 1-64 tokens repeated 3 times over at least 24 tokens, or twice from 32 tokens)
            with finish reason "repetition"; the repeated text already shown stays.
        repetition_penalty: Divide the positive logits (multiply the negative ones) of the
            tokens the answer already holds by this (`engine.sampling.RepetitionPenalty`);
            1.0 is off: outputs are exactly those without a penalty.
    """

    loop_guard: bool = True
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class EngineSettings:
    """Where the model runs: in this process (the default) or on an engine server.

    Attributes:
        url: The API root of an OpenAI-compatible server (llama.cpp's `llama-server`,
            `mlx_lm.server`, vLLM, SGLang), e.g. `http://127.0.0.1:8080/v1`; "" runs the
            model in process. `model.name` still names the local model directory the
            tokenizer (prompt layout, budgets) comes from.
        model: The `model` field sent to the server; "" sends the one it lists first.
        key_env: The environment variable holding the server's key (sent as a bearer token).
        key_file: A file holding the key instead; "" for none.
    """

    url: str = ""
    model: str = ""
    key_env: str = "CODECTX_ENGINE_KEY"
    key_file: str = ""


@dataclass(frozen=True)
class Settings:
    """Everything the server can be told. Every field has a default."""

    model: ModelSettings = field(default_factory=ModelSettings)
    compute: ComputeSettings = field(default_factory=ComputeSettings)
    window: WindowSettings = field(default_factory=WindowSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    hover: HoverSettings = field(default_factory=HoverSettings)
    ask: AskSettings = field(default_factory=AskSettings)
    focus: FocusSettings = field(default_factory=FocusSettings)
    warmup: WarmupSettings = field(default_factory=WarmupSettings)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)


_MINIMUMS = {
    "kv_bits": 0, "prefill_chunk": 1, "global_tokens": 0, "window_tokens": 1,
    "dense_tail_tokens": 0, "continuation_tail_tokens": 0,
    "budget_tokens": 1, "checkpoint_bytes": 0, "archive_bytes": 0,
    "latency_budget_ms": 0, "prefetch": 0, "prepare_batch": 1, "max_tokens": 1, "max_tool_calls": 0,
    "debounce_ms": 0, "blas_threads": 0, "repetition_penalty": 1.0,
}
_CHOICES = {"kv_bits": (8, 16), "gguf_bits": (4, 8, 16), "speculation": ("off", "lookup", "draft", "auto"),
            "attention": ATTENTION_CHOICES, "forward": FORWARD_CHOICES, "linear": LINEAR_CHOICES,
            "kernels": KERNEL_CHOICES, "room": ROOM_CHOICES}
_MAY_BE_EMPTY = {"draft_model", "url", "model", "key_file"}


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _check(name: str, kind: Any, value: Any) -> tuple[Any, str | None]:
    """Returns the value converted to `kind`, or a problem string."""
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if ok and value < _MINIMUMS.get(name, value):
            return None, f"{value!r} is out of range"
        value = float(value) if ok else value
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and (value < _MINIMUMS.get(name, value) or value not in _CHOICES.get(name, (value,))):
            return None, f"{value!r} is out of range"
    elif kind is str:
        ok = isinstance(value, str) and (bool(value) or name in _MAY_BE_EMPTY)
        if ok and value not in _CHOICES.get(name, (value,)):
            return None, f"{value!r} is not one of {_CHOICES[name]}"
    else:  # tuple[str, ...]
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    return (value, None) if ok else (None, f"expected {getattr(kind, '__name__', 'a list of strings')}, got {value!r}")


def _parse(cls: type, raw: Any, where: str, problems: list[str]) -> Any:
    if not isinstance(raw, dict):
        problems.append(f"{where or 'settings'}: expected an object, got {raw!r}")
        return cls()
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key, value in raw.items():
        name = _snake(key)
        path = f"{where}.{key}" if where else key
        if name not in known:
            problems.append(f"{path}: unknown setting")
            continue
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            values[name] = _parse(kind, value, path, problems)
            continue
        checked, problem = _check(name, kind, value)
        if problem:
            problems.append(f"{path}: {problem}; using the default")
        else:
            values[name] = checked
    return cls(**values)


def parse_settings(raw: Any) -> tuple[Settings, list[str]]:
    """Builds `Settings` from client JSON.

    Args:
        raw: The `codectx` object from the client (None means all defaults).

    Returns:
        The settings and a list of problems (empty when everything was valid).
    """
    if raw is None:
        return Settings(), []
    problems: list[str] = []
    return _parse(Settings, raw, "", problems), problems
