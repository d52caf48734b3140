"""Shared fixtures: a tiny llama model built once per session, loaded by the real loader; stand-ins for our
CUDA kernels."""
from __future__ import annotations

import mlx.core as mx
import pytest

from engine import cuda_attention, cuda_attention_mma, cuda_backend, cuda_chunk_attention, cuda_kv_write, cuda_qmv
from engine.engine import Engine
from engine.loading import load_model
from tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny llama directory (2 layers, hidden 128, head_dim 64, vocab 512, float32)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    """The tiny model as `engine.loading.load_model` returns it."""
    return load_model(str(tiny_model_dir), progress=False)


@pytest.fixture
def engine(tiny_loaded):
    """An Engine on the tiny model with small prefill chunks, closed after the test."""
    eng = Engine(tiny_loaded, prefill_chunk=16)
    yield eng
    eng.close()


@pytest.fixture
def semantic_kernels(monkeypatch):
    """Stand-ins for our CUDA kernels (no CPU build): the linears compute MLX's quantized product (plus the
    residual they are given, for the kernel that adds one); the write writes nothing and returns its row's
    position; the 8-bit attention returns a pattern of its key count n
    and of what it is ordered after (the write's position p; without a write, n again): sin(0.05 n + d) +
    cos(0.3 p) for dim d of every head; the chunk attention (a full-precision cache) attends for real over
    the first n rows, through a mask; the 8-bit chunk attention attends causally for real over the rows it is
    given, dequantized. Records the calls made (a replayed trace makes none)."""
    calls = []

    def qmv(inputs, template, output_shapes, output_dtypes, **_):
        calls.append("qmv")
        x, w, scales, biases = inputs
        t = dict(template)
        out = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=t["GS"], bits=t["BITS"])
        return [out.reshape(output_shapes[0]).astype(output_dtypes[0])]

    def write(inputs, **_):
        calls.append("write")
        return [inputs[-1].astype(mx.int32)]

    def partial(inputs, output_shapes, **_):
        calls.append("attention")
        n, p = inputs[-2][0].astype(mx.float32), inputs[-1][0].astype(mx.float32)
        value = mx.sin(0.05 * n + mx.arange(output_shapes[0][-1], dtype=mx.float32)) + mx.cos(0.3 * p)
        return [mx.broadcast_to(value, output_shapes[0]), mx.zeros(output_shapes[1], dtype=mx.float32)]

    def merge(inputs, output_shapes, template, **_):
        return [inputs[0][:, 0, :].reshape(output_shapes[0]).astype(dict(template)["T"])]

    def chunk(inputs, output_shapes, **_):  # one query over a full-precision cache: real attention, masked
        calls.append("chunk")
        q, keys, values, meta, scale2 = inputs
        heads, (rows, splits, dim) = q.shape[1], output_shapes[0]
        k, v = (mx.repeat(a, heads // a.shape[1], axis=1).astype(mx.float32) for a in (keys, values))
        scores = (q.astype(mx.float32) @ k.swapaxes(-1, -2)) * (scale2[0] / cuda_backend.LOG2E)
        weights = mx.softmax(mx.where(mx.arange(keys.shape[2]) < meta[0], scores, -mx.inf), axis=-1)
        # one query (meta[1]), splits that cover the buffers (meta[2]), a count inside them: else nothing
        launch_ok = (meta[1] == 1) & (meta[2] * splits >= keys.shape[2]) & (meta[0] <= keys.shape[2])
        out = mx.where(launch_ok, weights @ v, 0.0).reshape(rows, 1, dim)
        return [mx.concatenate([out, mx.zeros((rows, splits - 1, dim))], axis=1), mx.zeros(output_shapes[1])]

    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_kv_write, "shape_problem", lambda keys, bits, group_size=64: None)
    monkeypatch.setattr(cuda_attention, "unsupported", lambda *args: None)
    monkeypatch.setattr(cuda_qmv, "unsupported", lambda linear, dtype: None)
    monkeypatch.setattr(cuda_qmv, "_kernel", lambda: qmv)
    monkeypatch.setattr(cuda_qmv, "_residual_kernel", lambda: qmv_residual_stand_in(calls))
    monkeypatch.setattr(cuda_kv_write, "_q8_kernel", lambda: write)
    monkeypatch.setattr(cuda_attention, "_kernels", lambda: (partial, merge))
    monkeypatch.setattr(cuda_chunk_attention, "shape_problem", lambda *shape: None)  # the tiny model's heads
    monkeypatch.setattr(cuda_chunk_attention, "_kernel", lambda: chunk)
    monkeypatch.setattr(cuda_chunk_attention, "q8_problem", lambda *shape: None)  # the tiny model's dim and dtype
    monkeypatch.setattr(cuda_chunk_attention, "q8_rows_problem", lambda *shape: None)
    monkeypatch.setattr(cuda_chunk_attention, "_kernel_q8", lambda: q8_chunk_stand_in(calls))
    monkeypatch.setattr(cuda_attention_mma, "_merge_kernel", lambda: merge)
    return calls


def qmv_residual_stand_in(calls: list) -> object:
    """`semantic_kernels`' stand-in for our linear that adds a residual: MLX's product plus ``res``, rounded once."""
    def qmv_residual(inputs, template, output_shapes, output_dtypes, **_):
        calls.append("qmv+residual")
        x, w, scales, biases, residual = inputs
        t = dict(template)
        out = mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=t["GS"], bits=t["BITS"])
        return [(out.reshape(output_shapes[0]) + residual).astype(output_dtypes[0])]
    return qmv_residual


def q8_chunk_stand_in(calls: list) -> object:
    """`semantic_kernels`' stand-in for the 8-bit chunk attention: causal attention over the rows it is given,
    dequantized (its queries as the kernel reads them, bf16), zeros if launched with another count or chunk."""
    def chunk_q8(inputs, output_shapes, **_):  # a chunk over an 8-bit store's rows: real causal attention
        calls.append("chunk_q8")
        q, kq, ks, kb, vq, vs, vb, meta, scale2 = inputs
        heads, rows = q.shape[1], q.shape[2]
        k, v = (mx.repeat(mx.dequantize(*t, group_size=64, bits=8), heads // t[0].shape[1], axis=1).astype(mx.float32)
                for t in ((kq, ks, kb), (vq, vs, vb)))
        out = mx.fast.scaled_dot_product_attention(q.astype(mx.float32), k, v,
                                                   scale=(scale2[0] / cuda_backend.LOG2E).item(), mask="causal")
        launch_ok = (meta[0] == kq.shape[2]) & (meta[1] == rows)  # the count and the chunk's rows it was given
        splits = output_shapes[0][1]
        out = mx.where(launch_ok, out, 0.0).reshape(heads * rows, 1, -1)
        return [mx.concatenate([out, mx.zeros((heads * rows, splits - 1, out.shape[-1]))], axis=1),
                mx.zeros(output_shapes[1])]

    return chunk_q8
