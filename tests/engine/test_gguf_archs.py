"""GGUF files in every supported architecture and quantisation, loaded by codectx.

The files are tiny random-weight models written by the `gguf` package's writer in llama.cpp's
layout (tests/engine/gguf_models.py). The reference is the mlx-lm model built in float32 from
exactly what each file holds (its tensors dequantized by `gguf.quants.dequantize`, the GGUF
conventions undone on the test side), so the file's own quantisation error is not compared.
`TinyGGUF.reference(bits)` is that model unchanged at 32 and rounded to float16 at 16; at 8 and
4 bits it is what mlx-lm's own quantization (`mx.quantize`) would make of it, which a GGUF
conversion beats: groups already on a grid keep it, and finer types stay at 8 bits.

Tolerances (max |difference| over max |reference value|):
- Logits against `reference(bits)` at 32 and 16 bits: 1e-4. The arithmetic is the same; what may
  differ is float32 summation order (llama's RoPE on rows left permuted with interleaved pairs,
  which measured 1.0e-6; the other cases measured 0).
- Weights against the unconverted reference, one bound per element: 1e-6 of the tensor's
  largest value at 32 bits; float16 rounding (2^-11 relative) at 16; at 8 and 4 bits float16
  rounding of scales and biases where a group kept its grid, plus one quantization level of
  the group where it did not (`_group_bound`).
- Logits and greedy next tokens against the unconverted reference at 8 and 4 bits: see
  `REQUANT_LOGITS` and `GREEDY_AGREEMENT`.
"""
from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_models import (ALL_TYPES, ARCHITECTURES, GEMMA3_ROPE, LLAMA32_ROPE, TinyGGUF, permute_qk, to_gguf_layout,
                         write_gguf)
from mlx.utils import tree_flatten

from engine.gguf_convert import converted_dir
from engine.loading import load_model
from engine.model_manifest import manifest_problem
from engine.paths import models_dir

TEXT = "def greet(name):\n    return f'Grüße, {name}!' 🙂 x = 12345\n"

# qwen2 (tied embeddings, q/k/v biases) in every type; each other architecture in F32 and one
# K-quant, the K-quants spread over them.
EXACT_CASES = [("qwen2", t) for t in ALL_TYPES] + [
    ("llama", Q.F32), ("llama", Q.Q6_K), ("qwen3", Q.F32), ("qwen3", Q.Q4_K),
    ("gemma3", Q.F32), ("gemma3", Q.Q5_K),
]
# The K-quant file of each architecture, converted to 8 and 4 bits.
REQUANT_FILES = {"llama": Q.Q6_K, "qwen2": Q.Q4_K, "qwen3": Q.Q4_K, "gemma3": Q.Q5_K}
LOGIT_TOLERANCE = 1e-4
GREEDY_AGREEMENT = {8: 0.9, 4: 0.9}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """Writes each (arch, type) file once per module."""
    folder = tmp_path_factory.mktemp("gguf-archs")
    written: dict[tuple[str, Q], TinyGGUF] = {}

    def get(arch: str, qtype: Q) -> TinyGGUF:
        if (arch, qtype) not in written:
            written[arch, qtype] = write_gguf(folder / f"tiny-{arch}-{qtype.name}.gguf", arch, qtype)
        return written[arch, qtype]

    return get


def prompt_ids(tiny: TinyGGUF) -> mx.array:
    """The reference tokenizer's ids for TEXT (with bos where the model expects one): longer than
    Gemma's sliding window, so sliding layers see a window."""
    bos = [tiny.vocab.special["bos"]] if tiny.vocab.add_bos else []
    return mx.array([bos + tiny.vocab.encode(TEXT)])


def relative_error(actual: mx.array, expected: mx.array) -> float:
    return (mx.abs(actual - expected).max() / mx.abs(expected).max()).item()


def float_weights(model: nn.Module) -> dict[str, mx.array]:
    """Every parameter in float32, quantized modules dequantized (GPU loads keep them quantized)."""
    weights = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            weights[f"{name}.weight"] = mx.dequantize(module.weight, module.scales, module.biases,
                                                      group_size=module.group_size, bits=module.bits)
    for name, value in tree_flatten(model.parameters()):
        if not name.endswith((".scales", ".biases")) and name not in weights:
            weights[name] = value
    return {k: v.astype(mx.float32) for k, v in weights.items()}


def expected_weights(tiny: TinyGGUF, loaded) -> dict[str, np.ndarray]:
    """The reference weights in the loaded model's layout: a loader may keep llama's Q/K rows
    permuted and rotate interleaved pairs instead (`rope_traditional`), the same computation."""
    weights = dict(tiny.weights)
    if tiny.arch == "llama" and loaded.config.get("rope_traditional"):
        heads = {"q_proj": tiny.config["num_attention_heads"], "k_proj": tiny.config["num_key_value_heads"]}
        for name, w in weights.items():
            for proj, n in heads.items():
                if name.endswith(f"self_attn.{proj}.weight"):
                    weights[name] = permute_qk(w, n)
    return weights


def assert_weights_within(loaded, tiny: TinyGGUF, bound) -> None:
    """Each loaded weight against the reference: |loaded - expected| <= bound(expected) everywhere."""
    actual = float_weights(loaded.model)
    expected = expected_weights(tiny, loaded)
    assert set(actual) == set(expected)
    for name, want in expected.items():
        got = np.array(actual[name])
        assert got.shape == want.shape, name
        excess = np.abs(got - want) - bound(name, want)
        assert excess.max() <= 0, f"{name}: off by {excess.max():.3g} beyond the bound"


def load(tiny: TinyGGUF, bits: int):
    return load_model(str(tiny.path), progress=False, gguf_bits=bits)


@pytest.mark.parametrize(("arch", "qtype"), EXACT_CASES, ids=[f"{a}-{t.name}" for a, t in EXACT_CASES])
def test_32_bit_load_holds_the_files_values_and_matches_the_reference(gguf_file, arch, qtype):
    tiny = gguf_file(arch, qtype)
    loaded = load(tiny, 32)
    assert loaded.config["model_type"] == tiny.config["model_type"]
    assert_weights_within(loaded, tiny, lambda name, w: 1e-6 * np.abs(w).max())
    ids = prompt_ids(tiny)
    assert relative_error(loaded.model(ids), tiny.reference(32)(ids)) <= LOGIT_TOLERANCE


@pytest.mark.parametrize(("arch", "scaling"), [("llama", LLAMA32_ROPE), ("gemma3", GEMMA3_ROPE)],
                         ids=["llama-3.2-rope_freqs", "gemma3-linear"])
def test_rope_scaling_comes_from_the_file(tmp_path, arch, scaling):
    """Llama 3.2's scaling, which llama.cpp keeps only as the `rope_freqs` tensor, and Gemma 3
    4B+'s linear scaling of its global layers, on 320 positions (where scaling matters)."""
    tiny = write_gguf(tmp_path / f"tiny-{arch}-rope.gguf", arch, Q.Q8_0, rope_scaling=scaling)
    loaded = load(tiny, 32)
    assert_weights_within(loaded, tiny, lambda name, w: 1e-6 * np.abs(w).max())
    ids = mx.array(np.random.default_rng(0).integers(0, tiny.config["vocab_size"], (1, 320)))
    expected = tiny.reference(32)(ids)
    assert relative_error(loaded.model(ids), expected) <= LOGIT_TOLERANCE
    unscaled = replace(tiny, config={k: v for k, v in tiny.config.items() if k != "rope_scaling"})
    assert relative_error(unscaled.reference(32)(ids), expected) > 100 * LOGIT_TOLERANCE


def _group_bound(bits: int, on_grid: bool):
    """Per value: float16 rounding of the value, its group's scale and bias and the result
    (relative, 4 x 2^-11 of the group's largest value, taken as 2^-8; absolute where the scale is
    subnormal in float16, spacing 2^-24 times up to 2^bits - 1 levels), plus, unless the group
    kept its grid, one quantization level of the group, (max - min) / (2^bits - 1): not half a
    level, as the float16 bias can move the grid. 1-D tensors (norms, biases) are not quantized:
    float16 rounding only."""
    def bound(name: str, w: np.ndarray) -> np.ndarray:
        if w.ndim == 1:
            return np.abs(w) * 2.0**-11 + 1e-7
        groups = w.reshape(w.shape[0], -1, 32)
        top, bottom = groups.max(-1, keepdims=True), groups.min(-1, keepdims=True)
        level = 0.0 if on_grid else (top - bottom) / (2**bits - 1)
        largest = np.maximum(np.abs(top), np.abs(bottom))
        subnormal = (2**bits + 4) * 2.0**-24
        return np.broadcast_to(level + largest * 2.0**-8 + subnormal, groups.shape).reshape(w.shape)
    return bound


# What a conversion to 8 or 4 bits promises per source type (engine/gguf_convert.py): types of
# 4 bits or fewer go to 4 bits, finer ones (Q5_K, Q6_K, Q8_0, floats) to 8 even at a 4-bit
# target; types with one affine grid per 32 values (Q4_K, Q5_K at 8 bits) keep it exactly.
FINE = {Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.F16, Q.F32}
ON_GRID = {Q.Q4_K, Q.Q5_K, Q.Q8_0, Q.Q4_0, Q.Q4_1}
# Logits against the unconverted file, max |difference| over max |reference| (measured on these
# random models: 0.0004-0.0036 where grids stay exact, float16 scales being the only change;
# 0.013 for Q6_K's 8-bit requantization; greedy next tokens 100% and 97.6%).
REQUANT_LOGITS = 0.05


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_requantized_load_keeps_the_files_precision(gguf_file, arch, bits):
    qtype = REQUANT_FILES[arch]
    tiny = gguf_file(arch, qtype)
    loaded = load(tiny, bits)
    stored_bits = 8 if bits == 4 and qtype in FINE else bits
    on_grid = qtype in ON_GRID and stored_bits >= (4 if qtype == Q.Q4_K else 8)
    down = "model.layers.0.mlp.down_proj"
    quantization = loaded.config["quantization"]
    assert quantization.get(down, quantization)["bits"] == stored_bits
    stored = mx.load(str(converted_dir(tiny.path, bits) / "model.safetensors"))
    assert (stored[f"{down}.weight"].dtype, stored[f"{down}.scales"].dtype) == (mx.uint32, mx.float16)
    assert stored[f"{down}.weight"].shape[-1] * 32 // stored_bits == tiny.weights[f"{down}.weight"].shape[-1]
    assert_weights_within(loaded, tiny, _group_bound(stored_bits, on_grid))
    if on_grid:  # what a fresh min/max requantization (mlx-lm's) would have lost
        fresh = np.array(tiny.reference(stored_bits).model.layers[0].mlp.down_proj.weight)
        kept = np.array(float_weights(loaded.model)[f"{down}.weight"])
        want = tiny.weights[f"{down}.weight"]
        assert np.abs(kept - want).max() * 4 < np.abs(fresh - want).max()

    ids = prompt_ids(tiny)
    logits, unconverted = loaded.model(ids), tiny.reference(32)(ids)
    assert relative_error(logits, unconverted) <= REQUANT_LOGITS
    same = mx.mean(mx.argmax(logits, -1) == mx.argmax(unconverted, -1)).item()
    assert same >= GREEDY_AGREEMENT[bits], f"greedy next tokens agree at {same:.0%} of positions"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_16_bit_load_rounds_each_weight_to_float16(gguf_file, arch):
    tiny = gguf_file(arch, Q.F32)
    loaded = load(tiny, 16)
    assert_weights_within(loaded, tiny, lambda name, w: np.abs(w) * 2.0**-11 + 1e-7)
    ids = prompt_ids(tiny)
    assert relative_error(loaded.model(ids), tiny.reference(16)(ids)) <= LOGIT_TOLERANCE


def test_the_reference_tells_each_convention_apart(gguf_file):
    """Guards the tolerances above: a loader that skipped a convention would be far outside them."""
    def spread(tiny: TinyGGUF, **changes) -> float:
        ids = prompt_ids(tiny)
        return relative_error(replace(tiny, **changes).reference()(ids), tiny.reference()(ids))

    for arch in ("llama", "gemma3"):  # Q/K rows left permuted; norms left +1
        tiny = gguf_file(arch, Q.F32)
        as_stored = {k: to_gguf_layout(arch, k, v) for k, v in tiny.weights.items()}
        assert spread(tiny, weights=as_stored) > 100 * LOGIT_TOLERANCE, arch
    gemma = gguf_file("gemma3", Q.F32)
    for key, value in (("sliding_window", 4096), ("query_pre_attn_scalar", 256),
                       ("rope_local_base_freq", 1000000.0)):
        assert spread(gemma, config={**gemma.config, key: value}) > 100 * LOGIT_TOLERANCE, key


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tokenizer_and_chat_template_come_from_the_metadata(gguf_file, arch):
    tiny = gguf_file(arch, Q.F32)
    tokenizer = load(tiny, 32).tokenizer
    assert tokenizer.encode(TEXT) == tiny.vocab.encode(TEXT)
    assert tokenizer.decode(tokenizer.encode(TEXT)) == TEXT
    end_of_turn = "<end_of_turn>" if arch == "gemma3" else "<|im_end|>"
    assert tokenizer.encode(end_of_turn) == [tiny.vocab.tokens.index(end_of_turn)]
    assert tiny.vocab.special["eos"] in tokenizer.eos_token_ids
    # an answer ends at the template's end of turn even where the file's eos is another token
    # (Gemma's <eos>): llama.cpp stops there too, finding the token by its text
    assert tiny.vocab.tokens.index(end_of_turn) in tokenizer.eos_token_ids
    rendered = tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert rendered.endswith("<start_of_turn>model\n" if arch == "gemma3" else "<|im_start|>assistant\n")


def test_conversion_is_cached_once_with_a_manifest(gguf_file):
    tiny = gguf_file("qwen3", Q.Q4_K)
    first = load(tiny, 8)
    entries = [p for p in (models_dir() / "gguf").iterdir()
               if p.name.startswith(tiny.path.stem) and p.name.endswith("-b8")]
    assert len(entries) == 1 and entries[0].is_dir()
    assert manifest_problem(entries[0]) is None
    stamps = {p.name: p.stat().st_mtime_ns for p in entries[0].iterdir()}
    second = load(tiny, 8)
    assert {p.name: p.stat().st_mtime_ns for p in entries[0].iterdir()} == stamps  # not converted again
    ids = prompt_ids(tiny)
    assert mx.array_equal(first.model(ids), second.model(ids))
    assert first.weight_hash == second.weight_hash != load(tiny, 4).weight_hash
