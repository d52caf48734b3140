"""`/metrics`: engine, checkpoint and HTTP counters in Prometheus' text format (0.0.4)."""
from __future__ import annotations

from typing import Any, Iterable

from .activity import Totals

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _family(name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{label_text}}} {_number(value)}" if label_text else f"{name} {_number(value)}")
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(engine_stats: dict[str, Any] | None, totals: Totals, active: int,
           outcomes: dict[str, dict[str, int]] | None = None) -> str:
    """The exposition text.

    Args:
        engine_stats: `Engine.stats()`, or None while the model loads.
        totals: Counters over completed HTTP chat requests.
        active: HTTP chat requests in flight.
        outcomes: Requests by kind (ask, hover, http) and outcome (`server.core.outcomes`).
    """
    out = _family("codectx_up", "gauge", "1 when the engine is loaded.", [({}, 1 if engine_stats else 0)])
    out += _family("codectx_requests_total", "counter",
                   "Requests by kind (ask, hover, http) and outcome (finish reason, cancelled, error).",
                   [({"kind": kind, "outcome": outcome}, count)
                    for kind, counts in sorted((outcomes or {}).items()) for outcome, count in sorted(counts.items())])
    if engine_stats:
        cache = engine_stats.get("cache", {})
        out += _family("codectx_engine_requests_total", "counter", "Engine requests by outcome (all clients).",
                       [({"outcome": "served"}, engine_stats["requests_served"]),
                        ({"outcome": "cancelled"}, engine_stats["requests_cancelled"]),
                        ({"outcome": "failed"}, engine_stats["requests_failed"])])
        out += _family("codectx_engine_recomputed_tokens_total", "counter",
                       "Prompt tokens prefilled by the engine (all clients).", [({}, engine_stats["prompt_tokens"])])
        out += _family("codectx_engine_decode_tokens_total", "counter", "Tokens decoded (all clients).",
                       [({}, engine_stats["decode_tokens"])])
        out += _family("codectx_engine_queued_requests", "gauge", "Requests queued or running.",
                       [({}, max(0, engine_stats["queued"]) + (1 if engine_stats["running"] else 0))])
        for key, help_text in (("checkpoints", "Checkpoints held."),
                               ("checkpoint_bytes", "Bytes owned by checkpoints."),
                               ("budget_bytes", "Checkpoint memory budget in bytes."),
                               ("live_tokens", "Tokens of confirmed state on the live cache."),
                               ("live_cache_bytes", "Bytes of the live attention cache."),
                               ("archive_entries", "Checkpoints in the disk archive."),
                               ("archive_bytes", "Bytes of the disk archive.")):
            name = "codectx_checkpoint_budget_bytes" if key == "budget_bytes" else f"codectx_{key}"
            out += _family(name, "gauge", help_text, [({}, cache.get(key, 0))])
    out += _family("codectx_http_chat_requests_total", "counter",
                   "Completed HTTP chat requests by finish reason.",
                   [({"finish_reason": k}, v) for k, v in sorted(totals.requests.items())])
    out += _family("codectx_http_rejected_requests_total", "counter",
                   "HTTP chat requests answered with a 4xx before reaching the engine.", [({}, totals.rejected)])
    out += _family("codectx_http_refused_requests_total", "counter",
                   "HTTP requests refused for their Host name or browser Origin, by error code.",
                   [({"code": k}, v) for k, v in sorted(totals.refused.items())])
    out += _family("codectx_http_active_requests", "gauge", "HTTP chat requests in flight.", [({}, active)])
    for key, help_text in (("prompt_tokens", "Prompt tokens of completed HTTP chat requests."),
                           ("cached_tokens", "Prompt tokens restored from checkpoints."),
                           ("recomputed_tokens", "Prompt tokens prefilled."),
                           ("completion_tokens", "Tokens generated.")):
        out += _family(f"codectx_http_{key}_total", "counter", help_text, [({}, getattr(totals, key))])
    return "\n".join(out) + "\n"


def parse(text: str) -> dict[str, float]:
    """Sample name (with its label text) -> value; for tests and `codectx measure`."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
