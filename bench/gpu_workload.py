"""The GPU engine benchmark's workload: a random-weight model the engine can load, and a
synthetic repository laid out as segments the way `context` lays one out.

- `random_loaded`: bench/prefill.py's random model of a shape (4-bit for Qwen3-32B) wrapped as
  an `engine.loaded_model.LoadedModel`, with a word-level tokenizer over the model's whole
  vocabulary (``t0`` ... ``tN``; the last id is the end-of-text token), so every id a random
  model emits decodes.
- `Repository`: [system][map][file]...[hot]...; files are drawn from a pool of "lines" (short
  token runs) with a Zipf law over the pool, so n-grams repeat as in source code and prompt
  lookup has something to find. `Repository.edited` gives the layout after an edit of a file in
  the middle: the prefix stays, the file's new copy joins the hot tail (as `context.Workspace`
  does), so an ask recomputes only that copy and the question.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.request import PromptSegment, SegmentKind

EOS = "<|im_end|>"
HEADER = (11, 12, 13, 14, 15)
_LINES = 4096


def word_tokenizer(vocab_size: int) -> Any:
    """An `engine.tokenizer.Tokenizer` with one word per id (``t<id>``; the last id is `EOS`)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from engine.tokenizer import Tokenizer

    vocab = {f"t{i}": i for i in range(vocab_size - 1)} | {EOS: vocab_size - 1}
    backend = Backend(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS)
    return Tokenizer(hf, eos_token_ids=[vocab_size - 1])


def random_loaded(shape: Any, name: str, layers: int | None, context_length: int) -> Any:
    """bench/prefill.py's random model of `shape` as a `LoadedModel` (weights hashed by name and seed)."""
    from bench.prefill import build_model
    from engine.loaded_model import LoadedModel

    model = build_model(shape, layers)
    config = dict(shape.args, num_hidden_layers=model.args.num_hidden_layers)
    return LoadedModel(model=model, tokenizer=word_tokenizer(model.args.vocab_size), model_id=f"random-{name}",
                       weight_hash=f"random-{name}-seed0-{model.args.num_hidden_layers}",
                       context_length=context_length, path=Path("."), config=config)


def segment(kind: SegmentKind, key: str, ids: Any) -> PromptSegment:
    return PromptSegment(kind, key, tuple(int(t) for t in ids))


@dataclass(frozen=True)
class Repository:
    """A synthetic repository prefix: system, map, files, hot tail (each a `PromptSegment`)."""

    system: PromptSegment
    map: PromptSegment
    files: tuple[PromptSegment, ...]
    hot: tuple[PromptSegment, ...]
    vocab: int

    @property
    def prefix(self) -> list[PromptSegment]:
        return [self.system, self.map, *self.files, *self.hot]

    @property
    def tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.prefix)

    def prompt(self, question_seed: int, question_tokens: int = 40) -> list[PromptSegment]:
        """The prefix, a question of its own and the answer header."""
        rng = np.random.default_rng(question_seed)
        question = rng.integers(256, self.vocab - 16, question_tokens)
        return [*self.prefix, segment(SegmentKind.QUESTION, "", question), segment(SegmentKind.HEADER, "", HEADER)]

    def edited(self, seed: int = 7) -> tuple[Repository, str]:
        """The layout after editing a file in the middle (the first from the middle on of at most 2,000
        tokens): its new copy, 2% of its tokens changed, is appended to the hot tail."""
        middle = self.files[len(self.files) // 2:]
        target = next((f for f in middle if len(f.token_ids) <= 2000), middle[0])
        rng = np.random.default_rng(seed)
        ids = np.array(target.token_ids)
        changed = rng.choice(len(ids), size=max(1, len(ids) // 50), replace=False)
        ids[changed] = rng.integers(256, self.vocab - 16, len(changed))
        hot = tuple(h for h in self.hot if h.key != target.key) + (segment(SegmentKind.HOT, target.key, ids),)
        return dataclasses.replace(self, hot=hot), target.key


def _line_pool(rng: np.random.Generator, vocab: int) -> list[np.ndarray]:
    ids = np.minimum(rng.zipf(1.3, size=_LINES * 16), vocab - 300) + 255
    lengths = rng.integers(6, 16, _LINES)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [ids[s:s + n] for s, n in zip(starts, lengths)]


def _file_tokens(rng: np.random.Generator, pool: list[np.ndarray], weights: np.ndarray, size: int) -> np.ndarray:
    out, total = [], 0
    while total < size:
        line = pool[rng.choice(len(pool), p=weights)]
        out.append(line)
        total += len(line)
    return np.concatenate(out)[:size]


def _sizes(rng: np.random.Generator, budget: int, mean: int) -> list[int]:
    """File sizes (log-normal around `mean`, mean / 7.5 to 4 x mean) that sum to `budget` exactly."""
    sizes: list[int] = []
    while sum(sizes) < budget:
        sizes.append(int(min(max(rng.lognormal(np.log(mean), 0.6), mean / 7.5), 4 * mean)))
    sizes[-1] -= sum(sizes) - budget
    if sizes[-1] < mean // 15 and len(sizes) > 1:
        sizes[-2] += sizes.pop()
    return sizes


def synthetic_repository(total: int, vocab: int, seed: int = 0, hot_files: int = 2) -> Repository:
    """Exactly `total` prefix tokens: a 200-token system, files of 200-6000 tokens (log-normal around
    1500; 1/40 of `total` when that is less), edited copies of the `hot_files` smallest files of the first half in the hot tail (the
    prefix holds them twice, as after edits), and a map segment of what is left (at least 1.5%)."""
    rng = np.random.default_rng(seed)
    pool = _line_pool(rng, vocab)
    weights = 1.0 / np.arange(1, len(pool) + 1) ** 0.9
    weights /= weights.sum()
    system = segment(SegmentKind.SYSTEM, "", _file_tokens(rng, pool, weights, 200))
    mean = min(1500, total // 40)
    sizes = _sizes(rng, total - 200 - min(1500, total // 64) - hot_files * mean * 2 // 3, mean)
    files = tuple(segment(SegmentKind.FILE, f"src/module_{i:04d}.py", _file_tokens(rng, pool, weights, n))
                  for i, n in enumerate(sizes))
    hot = []
    for i in sorted(range(max(1, len(files) // 2)), key=lambda i: sizes[i])[:hot_files]:
        ids = np.array(files[i].token_ids)
        ids[rng.integers(0, len(ids), max(1, len(ids) // 50))] = rng.integers(256, vocab - 16)
        hot.append(segment(SegmentKind.HOT, files[i].key, ids))
    left = total - 200 - sum(sizes) - sum(len(h.token_ids) for h in hot)
    map_seg = segment(SegmentKind.MAP, "", _file_tokens(rng, pool, weights, max(left, 16)))
    return Repository(system, map_seg, files, tuple(hot), vocab)
