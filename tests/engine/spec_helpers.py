"""Tiny random models, a plain greedy reference, test prompts and a scripted drafter for the
speculative-decoding tests."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models import llama, qwen3_next
from mlx_lm.models.cache import make_prompt_cache

if TYPE_CHECKING:
    from engine.speculative import SpeculativeDecoder


def tiny_llama(
    seed: int, vocab: int = 256, hidden: int = 64, layers: int = 2, scale: float = 4.0
) -> llama.Model:
    """A float32 random-weight llama with a fixed seed.

    Matrices are scaled up by `scale`: at the default init a tiny model repeats
    one token forever; scaled, its greedy output mixes runs and varied text.
    """
    mx.random.seed(seed)
    model = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=hidden,
            num_hidden_layers=layers,
            intermediate_size=2 * hidden,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=vocab,
            tie_word_embeddings=True,
        )
    )
    model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model


def tiny_hybrid(seed: int, vocab: int = 256) -> qwen3_next.Model:
    """A float32 random qwen3_next: Gated DeltaNet layers (ArraysCache) + attention."""
    mx.random.seed(seed)
    model = qwen3_next.Model(
        qwen3_next.ModelArgs(
            model_type="qwen3_next",
            hidden_size=64,
            num_hidden_layers=4,
            intermediate_size=128,
            num_attention_heads=4,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=0,
            num_experts_per_tok=0,
            decoder_sparse_step=1,
            shared_expert_intermediate_size=0,
            mlp_only_layers=[0, 1, 2, 3],
            moe_intermediate_size=0,
            rms_norm_eps=1e-5,
            vocab_size=vocab,
            num_key_value_heads=2,
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
            max_position_embeddings=4096,
            head_dim=16,
        )
    )
    mx.eval(model.parameters())
    return model


def prefill(model, prompt: list[int], cache=None) -> list:
    """A cache holding every prompt token but the last (the decoder's precondition)."""
    cache = cache if cache is not None else make_prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array([prompt[:-1]], dtype=mx.uint32), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def plain_greedy(model, prompt: list[int], n: int, cache=None) -> list[int]:
    """mlx-lm's own one-token-per-step greedy decoding: the reference output."""
    out = []
    for tok, _ in generate_step(
        mx.array(prompt, dtype=mx.uint32),
        model,
        max_tokens=n,
        sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),
        prompt_cache=cache,
    ):
        out.append(int(tok))
    return out


def prompts(vocab: int = 256, count: int = 12) -> list[list[int]]:
    """Random prompts of many lengths, most with a repeated stretch to look up."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(count):
        n = [1, 3, 9, 24, 48, 80][i % 6]
        base = rng.integers(0, vocab, size=n).tolist()
        out.append(base + base[: n // 2] if i % 3 else base)
    return out


def decode(decoder: SpeculativeDecoder, n: int) -> list[int]:
    """The decoder's next `n` tokens, stepped until there are that many."""
    out: list[int] = []
    while len(out) < n:
        out += decoder.step(limit=n - len(out))
    return out


class ScriptedDrafter:
    """Drafts the given continuation of the reference output, wrong from position `wrong_at`."""

    def __init__(self, reference: list[int], prompt_len: int, k: int, wrong_at: int, vocab: int = 256):
        self.reference, self.prompt_len, self.k, self.wrong_at, self.vocab = (
            reference, prompt_len, k, wrong_at, vocab)
        self.calls = 0

    def draft(self, history, k=None):
        self.calls += 1
        done = len(history) - self.prompt_len
        drafts = self.reference[done : done + self.k]
        return [t if i < self.wrong_at else (t + 1) % self.vocab for i, t in enumerate(drafts)]

    def observe(self, drafted, accepted):
        pass


def chi2_pvalue(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularized upper gamma Q(dof/2, s/2)."""
    a, x = dof / 2.0, statistic / 2.0
    if x <= 0:
        return 1.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # series for the lower gamma P
        term = total = 1.0 / a
        k = a
        while abs(term) > 1e-15 * abs(total):
            k += 1
            term *= x / k
            total += term
        return max(0.0, 1.0 - math.exp(log_prefix) * total)
    # Lentz continued fraction for the upper gamma Q.
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_prefix) * h
