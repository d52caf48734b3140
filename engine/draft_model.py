"""A small mlx-lm model that drafts tokens for a larger target model.

The draft model must share the target's tokenizer: a draft token id has to
mean the same text to both. `check_vocabulary` compares the two vocabularies
and names what differs.

The drafter keeps its own cache and remembers which tokens that cache holds.
Each round it trims back to the longest common prefix with the current
history (rejected drafts go), feeds what is new, and drafts greedily. The
draft is therefore a deterministic function of the history, which is what the
rejection sampler in `engine.speculative` relies on for temperature > 0.

Across requests the draft cache is a `PrefixCache` of its own, with the
target's checkpoint machinery: `prefill_request` restores the longest valid
checkpoint of the draft model over the request's segments and prefills only
the rest, so the repository prefix is prefilled by the draft model once.
Anything that fails or is cancelled leaves the cache at confirmed state.

`drafter_for` builds one from the ``model.draftModel`` setting: the same
loader as the target (`engine.loading.load_model`), the vocabulary checked,
the compute path chosen by `engine.compute.choose` with the target's options.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from engine.checkpoint_types import Plan
from engine.compute import ComputeOptions, ComputePath, choose
from engine.errors import DraftModelMismatchError
from engine.generate import written_arrays
from engine.policy import CachePolicy
from engine.prefix_cache import PrefixCache, model_dtype
from engine.request import Metrics, Request

log = logging.getLogger(__name__)


def check_vocabulary(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    """Raise unless both tokenizers map the same strings to the same ids.

    Args:
        target_tokenizer: Anything with `get_vocab() -> dict[str, int]`
            (a `tokenizers.Tokenizer`, a transformers tokenizer, mlx-lm's
            `TokenizerWrapper`).
        draft_tokenizer: The draft model's tokenizer, same requirement.

    Raises:
        DraftModelMismatchError: The vocabularies differ; the message gives the
            sizes and a few differing entries.
    """
    target, draft = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target == draft:
        return
    missing = sorted(set(target) - set(draft))[:3]
    extra = sorted(set(draft) - set(target))[:3]
    moved = sorted(t for t in set(target) & set(draft) if target[t] != draft[t])[:3]
    details = []
    if missing:
        details.append(f"missing from the draft: {missing}")
    if extra:
        details.append(f"only in the draft: {extra}")
    if moved:
        details.append(
            "different ids: " + ", ".join(f"{t!r} {target[t]} vs {draft[t]}" for t in moved)
        )
    raise DraftModelMismatchError(
        f"the draft model's tokenizer differs from the target's "
        f"({len(draft)} vs {len(target)} tokens; {'; '.join(details)}); "
        "speculative decoding needs a draft model with the same tokenizer"
    )


class DraftModelDrafter:
    """Drafts k tokens greedily with a small model over its own cache.

    Args:
        model: The draft model's `ComputePath`, or a bare mlx-lm model (its path
            is then chosen with default `ComputeOptions`).
        cache: The draft model's cache; a fresh `make_prompt_cache(model)` when
            None. Its layers must be trimmable (KV caches): rejected drafts are
            removed by `trim`.
        k: Draft length per round.
        prefill_step: Chunk size when the draft model catches up on a long
            history (the prompt, on the first round).
        should_stop: Polled between chunks and draft steps; when it returns True
            the drafter stops early and returns what it has (the round then
            verifies fewer drafts, or none).
        model_id: Names the draft model in its checkpoints' policy.
        weight_hash: The draft weights' digest (`LoadedModel.weight_hash`), for its policy.
        checkpoint_budget_bytes: Bytes the draft's checkpoints may own (None:
            `engine.prefix_cache.default_budget_bytes()`).

    Raises:
        DraftModelMismatchError: The cache has a layer that cannot be trimmed.
    """

    def __init__(
        self,
        model: Any,
        cache: list[Any] | None = None,
        k: int = 4,
        prefill_step: int = 256,
        should_stop: Callable[[], bool] | None = None,
        model_id: str = "draft",
        weight_hash: str = "",
        checkpoint_budget_bytes: int | None = None,
    ) -> None:
        self.compute = model if isinstance(model, ComputePath) else choose(model, ComputeOptions())
        self.model = model = self.compute.model
        # Lazy weights would be evaluated on the engine's worker thread, which
        # cannot run graphs built on another thread's stream.
        mx.eval(model.parameters())
        self.cache = cache if cache is not None else make_prompt_cache(model)
        untrimmable = {type(c).__name__ for c in self.cache if not c.is_trimmable()}
        if untrimmable:
            raise DraftModelMismatchError(
                f"a draft model needs trimmable caches, got {sorted(untrimmable)}"
            )
        self.k = k
        self.prefill_step = prefill_step
        self.should_stop = should_stop or (lambda: False)
        self._consumed: list[int] = []  # the tokens the cache holds, in order
        self.forwards = 0
        policy = CachePolicy(model_id=model_id, weight_hash=weight_hash, dtype=model_dtype(model),
                             prefill_chunk=prefill_step, compute=self.compute.identity())
        self.prefix = PrefixCache(self.compute, policy, budget_bytes=checkpoint_budget_bytes,
                                  cache=self.cache)

    def reset(self) -> None:
        """Empty the cache (a new request with an unrelated prompt)."""
        self._trim_to(0)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Feed all tokens but the last, so the next draft starts warm."""
        self._catch_up(list(tokens)[:-1])

    def prefill_request(self, request: Request, should_cancel: Callable[[], bool],
                        metrics: Metrics | None = None) -> None:
        """Bring the draft cache to the request's prompt, reusing its checkpoints.

        The longest valid checkpoint of the draft model over the request's
        segments is restored and only the rest is prefilled, recording a
        checkpoint at each segment boundary (`engine.prefix_cache.PrefixCache`).

        Args:
            request: The request about to be decoded.
            should_cancel: Polled between prefill chunks.
            metrics: Receives `draft_cached_tokens` and `draft_recomputed_tokens`.

        Raises:
            RequestCancelled: From `should_cancel`; the cache is back at its
                last confirmed checkpoint.
        """
        ids = request.all_token_ids()
        scratch = Metrics()
        try:
            self._consumed = list(ids)  # exact once the prefill returns; rollback cuts it
            self.prefix.prefill(request, self.prefill_step, should_cancel, scratch)
        except BaseException:
            self.rollback()
            raise
        finally:
            if metrics is not None:
                metrics.draft_cached_tokens = scratch.cached_tokens
                metrics.draft_recomputed_tokens = scratch.recomputed_tokens

    def rollback(self) -> int:
        """Drop unconfirmed state: back to the last checkpoint; returns its tokens."""
        kept = self.prefix.rollback()
        del self._consumed[kept:]
        return kept

    def draft(self, history: Sequence[int], k: int | None = None) -> list[int]:
        """Propose up to k greedy tokens to follow `history`.

        Args:
            history: Every token so far (prompt then output).
            k: Draft length; `self.k` when None.

        Returns:
            Up to k token ids; fewer only when `should_stop` fired.
        """
        k = self.k if k is None else k
        history = [int(t) for t in history]
        if k <= 0 or not history:
            return []
        try:
            if not self._catch_up(history[:-1]):
                return []
            drafts: list[int] = []
            last = history[-1]
            for _ in range(k):
                if self.should_stop():
                    break
                logits = self.compute.forward(mx.array([[last]], dtype=mx.uint32), self.cache)
                self.forwards += 1
                self._consumed.append(last)
                last = int(mx.argmax(logits[0, -1]).item())
                drafts.append(last)
        except BaseException:
            self._resync()
            raise
        return drafts

    def observe(self, drafted: int, accepted: int) -> None:
        """Nothing to adapt: the draft model's k is fixed."""

    def _catch_up(self, tokens: list[int]) -> bool:
        common = 0
        limit = min(len(tokens), len(self._consumed))
        while common < limit and tokens[common] == self._consumed[common]:
            common += 1
        self._trim_to(common)
        while len(self._consumed) < len(tokens):
            if self.should_stop():
                return False
            chunk = tokens[len(self._consumed) : len(self._consumed) + self.prefill_step]
            self.compute.forward(mx.array([chunk], dtype=mx.uint32), self.cache, logits="none")
            mx.eval(written_arrays(self.cache))
            self.forwards += 1
            self._consumed.extend(chunk)
        return True

    def _trim_to(self, length: int) -> None:
        if length < self.prefix.store.line_offset:
            # Below the checkpointed line (a history unrelated to the last request):
            # leave the line, its checkpoints stay restorable as branches.
            self.prefix.store.restore(self.cache, Plan(path=[], archived=[], miss=None))
            self._consumed = self._consumed[: self.cache[0].offset]
        excess = len(self._consumed) - length
        if excess > 0:
            for c in self.cache:
                c.trim(excess)
            del self._consumed[length:]

    def _resync(self) -> None:
        """After a failed forward: drop whatever the cache holds beyond `_consumed`."""
        for c in self.cache:
            if c.offset > len(self._consumed):
                c.trim(c.offset - len(self._consumed))


def drafter_for(name: str, speculation: str, target_tokenizer: Any,
                options: ComputeOptions = ComputeOptions(), checkpoint_budget_bytes: int | None = None,
                k: int = 4, prefill_step: int = 256) -> DraftModelDrafter | None:
    """The drafter the ``model.draftModel`` and ``model.speculation`` settings ask for.

    The draft model is loaded like the target (`engine.loading.load_model`), its
    vocabulary is checked against the target's, and its compute path is chosen
    by `engine.compute.choose` with the target's options.

    Args:
        name: The draft model (a directory, a `.gguf`, a hub id); "" for none.
        speculation: The speculation mode; "off" and "lookup" never use a draft model.
        target_tokenizer: The target model's tokenizer; the draft's must equal it.
        options: The target's compute options.
        checkpoint_budget_bytes: Bytes the draft's checkpoints may own.
        k: Draft length per round.
        prefill_step: The draft's prefill chunk.

    Returns:
        None when no draft model is named or the mode does not use one.

    Raises:
        ModelNotFoundError, ModelLoadError: From the loader, or mode "draft" without a name.
        DraftModelMismatchError: The tokenizers differ, or the draft's cache cannot be trimmed.
    """
    from engine.errors import ModelLoadError
    from engine.loading import load_model

    if speculation == "draft" and not name:
        raise ModelLoadError("speculation 'draft' needs a draft model (the model.draftModel setting)")
    if not name or speculation not in ("draft", "auto"):
        return None
    loaded = load_model(name, progress=False)
    check_vocabulary(target_tokenizer, loaded.tokenizer)
    log.info("draft model %s", loaded.model_id)
    return DraftModelDrafter(choose(loaded.model, options), k=k, prefill_step=prefill_step,
                             model_id=str(loaded.model_id), weight_hash=str(loaded.weight_hash),
                             checkpoint_budget_bytes=checkpoint_budget_bytes)
