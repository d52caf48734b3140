"""Our linears of few, long rows with each warp's rows split over K (`engine.cuda_qmv_split`): which products it
splits, and that a one-token forward asks for it only while ``qmv_split`` runs beside ``qmv``. The kernel is
CUDA's: a stand-in computing MLX's quantized product (and recording the split it was launched with) takes its
place here."""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from engine import cuda_qmv_split, linear_mode
from engine.decode_choice import DecodeKernels, choose_kernels
from engine.cuda_qmv_split import split_k


def test_the_split_takes_few_long_rows_of_one_input_row_within_one_wave():
    assert split_k(5120, 25600, 4) == 2  # Qwen3-32B's down projection: 2,560 warps of 25 chunk steps
    assert split_k(5120, 8192, 4) == 2  # its o projection: 8 steps, 4 a part
    assert split_k(25600, 5120, 4) == 1  # the gate and up projections: 12,800 warps already
    assert split_k(5120, 4096, 4) == 1  # 4 steps: too short to split
    assert split_k(5120, 25600, 4, rows=3) == 1  # a verify forward's rows hold more registers
    assert split_k(1024, 25600, 4) == 4  # few rows: the most splits within the wave
    for n, k in ((5120, 25600), (1024, 25600), (4096, 65536)):
        split = split_k(n, k, 4)
        assert n // (2 if n >= 4096 else 1) * split <= cuda_qmv_split.RESIDENT_WARPS


def test_a_one_token_forward_splits_our_linears_only_while_asked(monkeypatch, semantic_kernels):
    launched = []

    def split_stand_in(inputs, template, output_shapes, output_dtypes, **_):
        x, w, scales, biases = inputs
        t = dict(template)
        launched.append(t["SPLIT"])
        out = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=t["GS"], bits=t["BITS"])
        return [out.reshape(output_shapes[0]).astype(output_dtypes[0])]

    monkeypatch.setattr(cuda_qmv_split, "_kernel", lambda: split_stand_in)
    monkeypatch.setattr(cuda_qmv_split, "split_k", lambda n, k, bits, rows=1: 2 if n > 64 else 1)
    linear = nn.QuantizedLinear(128, 256, bias=False, group_size=64, bits=4)
    small = nn.QuantizedLinear(128, 64, bias=False, group_size=64, bits=4)
    x = mx.random.normal((1, 1, 128), key=mx.random.key(1))
    expected = (linear(x), small(x))
    with linear_mode.wired([linear, small]):
        for kernels, splits in ((DecodeKernels(qmv=True, qmv_split=True, source="setting"), [2]),
                                (DecodeKernels(qmv=True, source="setting"), [])):
            launched.clear()
            with kernels.scope(rows=1):
                got = (linear(x), small(x))
            assert launched == splits  # the short matrix unsplit, through our plain kernel
            assert all(mx.allclose(a, b, atol=1e-4).item() for a, b in zip(got, expected))
    assert semantic_kernels.count("qmv") == 3  # the plain kernel: the short matrix, then both unsplit


def test_the_split_runs_only_beside_our_linears():
    chosen, notes = choose_kernels({"qmv_split": (1e-3, 0.5e-3)})
    assert not chosen["qmv_split"] and "kernels: qmv_split needs qmv" in notes
    chosen, _ = choose_kernels({"qmv": (1e-3, 0.5e-3), "qmv_split": (1e-3, 0.5e-3)})
    assert chosen["qmv"] and chosen["qmv_split"]
