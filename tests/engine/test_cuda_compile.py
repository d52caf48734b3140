"""Every CUDA kernel of ours compiles for the H200 (sm_90), checked on a machine without a GPU.

Each kernel's Python entry point is called with the shapes the engine gives it for a Qwen3-32B-shaped model
(and the other widths, group sizes and dtypes its checks let through), MLX's `cuda_kernel` replaced by a
recorder (tests/engine/cuda_compile.py), and each distinct kernel source it would have built is compiled by
NVRTC. A kernel edited without a GPU at hand fails here, not in the first minutes of a lent one.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine import (cuda_attention, cuda_attention_mma, cuda_attention_staged, cuda_attention_transposed,
                    cuda_chunk_attention, cuda_dequant, cuda_kv_write, cuda_qk_rope, cuda_qmv, cuda_qmv_split)
from tests.engine.cuda_compile import compile_errors, recorded, resources

FACTORIES = (cuda_attention._kernels, cuda_attention_mma._kernel, cuda_attention_mma._merge_kernel,
             cuda_attention_staged._kernel, cuda_attention_transposed._kernel, cuda_dequant._rows_kernel,
             cuda_chunk_attention._kernel, cuda_chunk_attention._kernel_q8, cuda_dequant._kernel,
             cuda_kv_write._q8_kernel, cuda_qmv._kernel, cuda_qmv._three_kernel, cuda_qmv._glu_kernel,
             cuda_qk_rope._kernel, cuda_qmv_split._kernel, cuda_qmv._residual_kernel, cuda_qmv_split._residual_kernel)
H, KV, D, HIDDEN = 64, 8, 128, 5120  # Qwen3-32B's attention and width


@pytest.fixture
def recorder(monkeypatch):
    yield from recorded(monkeypatch, FACTORIES)


def eight_bit(rows: int, dtype=mx.bfloat16, group_size: int = 64) -> tuple:
    return (mx.zeros((1, KV, rows, D // 4), dtype=mx.uint32), mx.zeros((1, KV, rows, D // group_size), dtype=dtype),
            mx.zeros((1, KV, rows, D // group_size), dtype=dtype))


def quantized(n: int, bits: int, group_size: int, dtype) -> nn.QuantizedLinear:
    linear = nn.QuantizedLinear(HIDDEN, n, bias=False, group_size=group_size, bits=bits)
    linear.set_dtype(dtype)
    return linear


def launch_every_kernel() -> None:
    """Each entry point at the shapes the engine uses (decode, verify, prefill, a traced step's array count)."""
    for bits, group_size in ((4, 64), (4, 32), (4, 128), (8, 64), (8, 32)):
        for dtype, rows, n in ((mx.bfloat16, 1, 1024), (mx.bfloat16, 1, HIDDEN), (mx.float16, 3, 25600)):
            weight = mx.zeros((n, HIDDEN * bits // 32), dtype=mx.uint32)
            scales = mx.zeros((n, HIDDEN // group_size), dtype=dtype)
            cuda_qmv.qmv(mx.zeros((1, rows, HIDDEN), dtype=dtype), weight, scales, scales, bits=bits,
                         group_size=group_size)
            cuda_qmv_split.qmv(mx.zeros((1, rows, HIDDEN), dtype=dtype), weight, scales, scales, bits=bits,
                               group_size=group_size, split=2 if rows > 1 else 4)
            if rows == 1:  # a block's residual added in the launch (decode)
                residual = mx.zeros((1, rows, n), dtype=dtype)
                cuda_qmv.qmv(mx.zeros((1, rows, HIDDEN), dtype=dtype), weight, scales, scales, bits=bits,
                             group_size=group_size, residual=residual)
                cuda_qmv_split.qmv(mx.zeros((1, rows, HIDDEN), dtype=dtype), weight, scales, scales, bits=bits,
                                   group_size=group_size, split=2, residual=residual)
        for dtype in (mx.bfloat16, mx.float16):
            cuda_dequant.dequantize(weight, scales.astype(dtype), scales.astype(dtype), bits=bits,
                                    group_size=group_size, dtype=dtype)
            if group_size == 64:  # a KV store's rows (head dim 128), a slice of its buffers
                rows = tuple(mx.zeros((1, KV, 1024, n), dtype=t)[..., 5:700, :]
                             for n, t in ((128 * bits // 32, mx.uint32), (2, dtype), (2, dtype)))
                cuda_dequant.dequantize_rows(*rows, bits=bits, group_size=group_size)
        for dtype, rows, widths in ((mx.bfloat16, 1, (8192, 1024, 1024)), (mx.float16, 3, (1024, 256, 257))):
            q, k, v = (quantized(n, bits, group_size, dtype) for n in widths)  # two rows a warp; one
            cuda_qmv.three(mx.zeros((1, rows, HIDDEN), dtype=dtype), (q, k, v))
            cuda_qmv.glu(mx.zeros((1, rows, HIDDEN), dtype=dtype), q, q)
    query, count = mx.zeros((1, H, 1, D), dtype=mx.bfloat16), mx.array([700], dtype=mx.int32)
    for n in (700, count):
        keys, values = eight_bit(1024), eight_bit(1024)
        for kernel in ("cores", "mma", "staged", "transposed"):
            cuda_attention.decode_attention(query, keys, values, n, 0.088, 64, kernel=kernel)
        written = cuda_kv_write.write_q8_ordered(keys, values, query[:, :KV], query[:, :KV], n, 64)[2]
        for kernel in ("mma", "staged", "transposed"):
            cuda_attention.decode_attention(query, keys, values, n, 0.088, 64, kernel=kernel, after=written)
        cache = mx.zeros((1, KV, 1024, D), dtype=mx.bfloat16)
        for rows in ((1,) if isinstance(n, mx.array) else (2, 45)):
            cuda_chunk_attention.chunk_attention(mx.zeros((1, H, rows, D), dtype=mx.bfloat16), cache, cache, n,
                                                 0.088)
            cut = tuple(a[..., :750, :] for a in eight_bit(1024))  # the rows an 8-bit store's read_quantized gives
            cuda_chunk_attention.chunk_attention(mx.zeros((1, H, rows, D), dtype=mx.bfloat16), cut, cut, n, 0.088)
    cuda_attention.decode_attention(query.astype(mx.float16), eight_bit(1024, mx.float16),
                                    eight_bit(1024, mx.float16), 700, 0.088, 64)
    for module, dtype in ((attention_module("qwen3", 128), mx.bfloat16), (attention_module("llama", 64), mx.float16)):
        assert cuda_qk_rope.takes(module, dtype)
        width, kv_width = module.q_proj.weight.shape[0], module.k_proj.weight.shape[0]
        for position in (700, count):
            cuda_qk_rope.qk_rope(module, mx.zeros((1, 1, width), dtype=dtype), mx.zeros((1, 1, kv_width), dtype=dtype),
                                 position)


def attention_module(kind: str, head_dim: int):
    """mlx-lm's attention module of a qwen3 (per-head norms) or llama block, Qwen3-32B's heads, in the dtype
    the test gives it."""
    from importlib import import_module

    models = import_module(f"mlx_lm.models.{kind}")
    args = models.ModelArgs(model_type=kind, hidden_size=256, num_hidden_layers=1, intermediate_size=512,
                            num_attention_heads=H, num_key_value_heads=KV, head_dim=head_dim, rms_norm_eps=1e-6,
                            vocab_size=64, rope_theta=1e6, max_position_embeddings=4096, tie_word_embeddings=False)
    module = models.Attention(args)
    module.set_dtype(mx.bfloat16 if kind == "qwen3" else mx.float16)
    return module


def test_every_kernel_source_compiles_for_the_h200(recorder):
    launch_every_kernel()
    sources = recorder.sources()
    assert {label.split("_")[1] for label in sources} >= {"qmv", "qmv3", "dequantize", "q8", "chunk", "kv"}
    assert any(label.startswith("codectx_dequantize_rows") for label in sources)
    assert any(label.startswith("codectx_qmv_glu") for label in sources)
    assert any(label.startswith("codectx_qmv_split") for label in sources)
    assert any(label.startswith("codectx_qmv_residual") for label in sources)
    assert any(label.startswith("codectx_qmv_split_residual") for label in sources)
    assert any(label.startswith("codectx_q8_attention_staged") for label in sources)
    assert any(label.startswith("codectx_q8_attention_transposed") for label in sources)
    assert {label.split("_")[-1] for label in sources if label.startswith("codectx_qk_rope")} == {"True", "False"}
    assert any(label.startswith("codectx_chunk_attention_q8") for label in sources)
    failures = {label: errors for label, source in sources.items() if (errors := compile_errors(source))}
    assert not failures, "\n\n".join(f"{label}:\n{errors}" for label, errors in failures.items())


@pytest.mark.parametrize("module", [cuda_attention_staged, cuda_attention_transposed], ids=lambda m: m.__name__)
def test_three_blocks_of_a_staged_attention_fit_on_a_multiprocessor(recorder, module):
    """`TARGET_WARPS` of the staged attentions is one wave of `BLOCKS_PER_MULTIPROCESSOR` blocks a multiprocessor
    (three for the staged kernel, two for the transposed one): each kernel must keep to the registers (65,536 a
    multiprocessor, allocated eight a thread at a time) and shared memory (227 KB) of three, without spilling."""
    launch_every_kernel()
    kernel = "codectx_q8_attention_" + module.__name__.rsplit("_", 1)[1]
    sources = [source for label, source in recorder.sources().items() if label.startswith(kernel)]
    assert sources
    assert module.TARGET_WARPS == module.BLOCKS_PER_MULTIPROCESSOR * module.WARPS * 132
    assert module.BLOCKS_PER_MULTIPROCESSOR <= 3
    assert 3 * module.WARPS * module.STAGES * cuda_attention_staged.STAGE_BYTES <= 227 * 1024
    threads = 3 * module.WARPS * 32
    for source in sources:
        used = resources(source)
        assert -(-used["registers"] // 8) * 8 * threads <= 65536, used
        assert used["spill_stores"] == used["spill_loads"] == 0, used


def test_a_kernel_called_at_row_counts_that_vary_per_chunk_is_built_once(recorder):
    """MLX builds a custom kernel once per source and template: a size that varies from call to call (the rows
    of an 8-bit cache dequantized for a prefill chunk or a question, the keys a decode step attends) must be an
    input, not a template constant, or every new count compiles anew in the middle of a request."""
    for rows in (1000, 1300, 131072):
        packed, scales, biases = (a.reshape(-1, a.shape[-1]) for a in eight_bit(rows))
        cuda_dequant.dequantize(packed, scales, biases, bits=8, group_size=64, dtype=mx.bfloat16)
        cuda_dequant.dequantize_rows(*(a[..., 3:rows, :] for a in eight_bit(rows + 256)), bits=8, group_size=64)
        query = mx.zeros((1, H, 1, D), dtype=mx.bfloat16)
        for kernel in ("mma", "staged", "transposed"):
            cuda_attention.decode_attention(query, eight_bit(rows + 256), eight_bit(rows + 256), rows, 0.088, 64,
                                            kernel=kernel)
    built = [definition.name.rsplit("_", 1)[0] for definition, *_ in recorder.launches]
    assert built.count("codectx_dequantize") == 3 and built.count("codectx_dequantize_rows") == 3
    assert built.count("codectx_q8_attention_staged") == built.count("codectx_q8_attention_transposed") == 3
    assert len(recorder.sources()) == 6  # the two dequantizes, the three attentions, their merge


def test_the_compile_check_finds_an_error_in_a_kernel_body(recorder):
    """The check is not vacuous: one wrong line in a recorded kernel's body is reported, with its line."""
    launch_every_kernel()
    label, source = next((label, source) for label, source in recorder.sources().items() if "qmv" in label)
    assert compile_errors(source) is None
    errors = compile_errors(source.replace("if (row0 >= N) return;", "if (row0 >= N) return undeclared_name;"))
    assert errors is not None and "undeclared_name" in errors


@pytest.mark.parametrize("module", [cuda_attention_staged, cuda_attention_transposed], ids=lambda m: m.__name__)
def test_the_staged_attentions_blocks_stay_within_one_wave_at_every_key_count(module):
    """`TARGET_WARPS` of the staged attentions is one wave (`BLOCKS_PER_MULTIPROCESSOR` blocks on each of 132
    multiprocessors, at most the three that fit): each KV head's warps are whole blocks, so no key count spills
    blocks into a second wave."""
    wave = module.TARGET_WARPS // module.WARPS
    for kv_heads in (8, 4, 2):
        for n in range(16384, 140000, 97):
            splits = -(-n // module.split_size(n, kv_heads))
            assert -(-splits // module.WARPS) * kv_heads <= wave, (kv_heads, n)


def test_twelve_warps_of_each_chunk_attention_fit_on_a_multiprocessor(recorder):
    """`cuda_chunk_attention.WARPS` warps a block, one block a multiprocessor at least: the bf16 and 8-bit kernels
    keep to the registers of twelve warps without spilling (their shared memory is static, under 48 KB)."""
    launch_every_kernel()
    sources = {label: source for label, source in recorder.sources().items()
               if label.startswith("codectx_chunk_attention")}
    assert any("_q8_" in label for label in sources) and len(sources) >= 2
    for label, source in sources.items():
        used = resources(source)
        assert -(-used["registers"] // 8) * 8 * cuda_chunk_attention.WARPS * 32 <= 65536, (label, used)
        assert used["spill_stores"] == used["spill_loads"] == 0, (label, used)


def test_the_split_linears_registers_hold_the_wave_it_sizes_itself_by(recorder):
    """`cuda_qmv_split.RESIDENT_WARPS` counts five blocks of `cuda_qmv.WARPS` warps a multiprocessor for one input
    row: the split kernel must keep to those registers, or its splits spill into a second wave."""
    launch_every_kernel()
    one_row = {label: source for label, source in recorder.sources().items()
               if label.startswith("codectx_qmv_split") and "_1_2_" in label}  # M = 1, R = 2 (with a residual too)
    assert one_row
    blocks = cuda_qmv_split.RESIDENT_WARPS // 132 // cuda_qmv.WARPS
    for label, source in one_row.items():
        used = resources(source)
        assert -(-used["registers"] // 8) * 8 * cuda_qmv.WARPS * 32 * blocks <= 65536, (label, used)


def test_four_blocks_of_the_transposed_attention_fit_under_launch_bounds_without_spilling(recorder):
    """`cuda_attention_transposed.FOUR_BLOCKS` (a benchmark's variant): with the bounds its header gives `__global__`,
    the compiler holds the kernel to four blocks' registers without spilling, and three stages fit four blocks'
    shared memory. Without the bounds it takes more than four blocks allow. (Measured with a partial a warp: with
    its warps folded in the block, `COMBINE`, it spills.)"""
    transposed = cuda_attention_transposed
    stages, warps, blocks = transposed.FOUR_BLOCKS
    assert warps == blocks * transposed.WARPS * 132
    assert blocks * transposed.WARPS * stages * cuda_attention_staged.STAGE_BYTES <= 227 * 1024
    query, cache = mx.zeros((1, H, 1, D), dtype=mx.bfloat16), eight_bit(1024)
    for min_blocks in (0, blocks):
        transposed.partial_attention(query, cache, cache, 700, 0.088, stages=stages, target_warps=warps,
                                     min_blocks=min_blocks, combine=False)
    plain, bounded = (resources(source) for source in recorder.sources().values())
    threads = blocks * transposed.WARPS * 32
    assert -(-bounded["registers"] // 8) * 8 * threads <= 65536 < -(-plain["registers"] // 8) * 8 * threads
    assert bounded["spill_stores"] == bounded["spill_loads"] == bounded["stack"] == 0, bounded


def test_the_transposed_attention_folds_a_blocks_warps_into_one_partial_for_the_merge(recorder):
    """With `COMBINE` (the engine's default) the transposed attention writes one partial a block, and the merge is
    handed that many; with it off, one a warp. Both sources compile, and the folded one keeps three blocks'
    registers without spilling (the test above covers the default)."""
    transposed = cuda_attention_transposed
    assert transposed.COMBINE
    query, cache = mx.zeros((1, H, 1, D), dtype=mx.bfloat16), eight_bit(131072 + 256)
    folded = transposed.partial_attention(query, cache, cache, 131072, 0.088)
    apart = transposed.partial_attention(query, cache, cache, 131072, 0.088, combine=False)
    assert apart[0].shape[1] == transposed.WARPS * folded[0].shape[1]
    assert folded[0].shape == (H, folded[1].shape[1], D) and folded[1].shape[2] == 2
    assert folded[0].shape[1] * KV <= transposed.TARGET_WARPS // transposed.WARPS  # one wave
    merged = cuda_attention_mma.merge(*folded, mx.bfloat16)
    assert merged.shape == (H, D)
    templates = [dict(template) for definition, _, template, _ in recorder.launches
                 if definition.name.startswith("codectx_q8_attention_transposed")]
    assert [t["COMBINE"] for t in templates] == [1, 0]
    for label, source in recorder.sources().items():
        if label.startswith("codectx_q8_attention_transposed"):
            assert compile_errors(source) is None, label
            used = resources(source)
            assert used["spill_stores"] == used["spill_loads"] == 0, (label, used)
