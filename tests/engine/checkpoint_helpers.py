"""Prompt layouts and runners shared by the checkpoint, archive and hybrid tests."""
from __future__ import annotations

from dataclasses import replace

import mlx.core as mx

from engine.boundaries import boundaries
from engine.engine import Engine
from engine.request import DoneEvent, PromptSegment, Request, TokenEvent
from tiny_models import corpus


def repo_segments(tokenizer, n_files: int = 5, file_tokens: int = 40) -> list[PromptSegment]:
    """[system][file 0]..[file n-1] cut from the fixed corpus (distinct tokens per file)."""
    ids = tokenizer.encode(corpus())
    system = PromptSegment("system", "system", tuple(ids[:file_tokens // 2]), protected=True)
    files = [PromptSegment("file", f"src/f{i}.py",
                           tuple(ids[(i + 1) * file_tokens:(i + 2) * file_tokens]))
             for i in range(n_files)]
    return [system, *files]


def archive_bounds(i: int, parent_tokens: tuple[int, ...] = ()):
    """The boundaries of a two-file layout under the policy "pol" (the second file's tokens from `i`)."""
    segs = [PromptSegment("file", "a", parent_tokens or (1, 2, 3)), PromptSegment("file", "b", (i, i + 1))]
    return boundaries("pol", segs)


def archive_arrays(seed: int):
    """A checkpoint's KV and recurrent arrays, random from `seed`."""
    mx.random.seed(seed)
    return {"1.kv.0": mx.random.normal((1, 1, 2, 8)), "1.kv.1": mx.random.normal((1, 1, 2, 8))}, \
        {"0.rec.0": mx.random.normal((1, 3, 4))}


def ask(tokenizer, repo: list[PromptSegment], question: str,
        turns: tuple[str, ...] = ()) -> list[PromptSegment]:
    """repo + earlier turns + question + response header."""
    tail = [PromptSegment("turn", f"turn{i}", tuple(tokenizer.encode(t)))
            for i, t in enumerate(turns)]
    tail.append(PromptSegment("question", "q", tuple(tokenizer.encode(question))))
    tail.append(PromptSegment("header", "h", tuple(tokenizer.encode("<|im_start|>assistant\n")),
                              protected=True))
    return [*repo, *tail]


def edit(repo: list[PromptSegment], index: int, new_ids: tuple[int, ...]) -> list[PromptSegment]:
    """`repo` with segment `index` replaced by `new_ids` (same kind and key)."""
    out = list(repo)
    out[index] = replace(out[index], token_ids=new_ids)
    return out


def run(engine: Engine, segments: list[PromptSegment], max_tokens: int = 8, **kw):
    """Submit one request; return (generated token ids, DoneEvent)."""
    events = list(engine.submit(Request(segments=segments, max_tokens=max_tokens), **kw))
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason in ("length", "stop"), done
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids], done


def cold(loaded, segments: list[PromptSegment], max_tokens: int = 8, **engine_kw):
    """The answer of a fresh engine (nothing cached)."""
    with Engine(loaded, prefill_chunk=16, **engine_kw) as fresh:
        tokens, done = run(fresh, segments, max_tokens)
    assert done.metrics.cached_tokens == 0
    return tokens


def prefix_len(segments: list[PromptSegment], n: int) -> int:
    """Tokens in the first `n` segments."""
    return sum(len(s.token_ids) for s in segments[:n])


def restorable(store, segments: list[PromptSegment], seen: set[str]) -> int:
    """Tokens a restore should keep: the longest run of this prompt's boundaries that
    earlier prompts also had (keys in `seen`), never the whole prompt. Adds this
    prompt's keys to `seen`."""
    total = prefix_len(segments, len(segments))
    bounds = store.boundaries(segments)
    kept = 0
    for b in bounds:
        if b.key not in seen or b.end >= total:
            break
        kept = b.end
    seen.update(b.key for b in bounds)
    return kept
