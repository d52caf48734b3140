"""The settings tree: defaults, camelCase input, problems instead of exceptions."""
from __future__ import annotations

from server.core.settings import Settings, parse_settings


def test_none_gives_defaults_without_problems():
    assert parse_settings(None) == (Settings(), [])


def test_camel_case_values_are_applied():
    settings, problems = parse_settings({"model": {"name": "/m", "kvBits": 16, "prefillChunk": 64},
                                         "context": {"budgetTokens": 100, "exclude": ["*.lock"]},
                                         "hover": {"latencyBudgetMs": 0}})
    assert problems == []
    assert settings.model.name == "/m" and settings.model.kv_bits == 16 and settings.model.prefill_chunk == 64
    assert settings.context.exclude == ("*.lock",) and settings.hover.latency_budget_ms == 0
    assert settings.ask == Settings().ask


def test_invalid_values_keep_defaults_and_are_named():
    settings, problems = parse_settings({"model": {"kvBits": 3, "name": 5, "speculation": "always"},
                                         "hover": "fast", "nope": 1,
                                         "warmup": {"enabled": "yes", "debounceMs": -1},
                                         "ask": {"maxTokens": True}})
    defaults = Settings()
    assert settings == defaults
    joined = "\n".join(problems)
    for name in ("model.kvBits", "model.name", "model.speculation", "hover", "nope", "warmup.enabled", "warmup.debounceMs",
                 "ask.maxTokens"):
        assert name in joined
    assert len(problems) == 8


def test_top_level_not_an_object():
    settings, problems = parse_settings(["x"])
    assert settings == Settings() and len(problems) == 1


def test_gguf_bits_default_is_the_engines_and_other_values_are_refused():
    from engine.gguf import DEFAULT_GGUF_BITS

    assert Settings().model.gguf_bits == DEFAULT_GGUF_BITS
    settings, problems = parse_settings({"model": {"ggufBits": 8}})
    assert settings.model.gguf_bits == 8 and not problems
    settings, problems = parse_settings({"model": {"ggufBits": 3}})
    assert settings.model.gguf_bits == DEFAULT_GGUF_BITS and any("ggufBits" in p for p in problems)
