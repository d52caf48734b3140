"""The operations a traced decode step holds besides the model's own: what each layer adds to a step's graph is
a launch on the GPU (about 3 µs each in the H200's profile, docs/benchmarks.md), so per-step values (a key
count, its sizes) are made once for all layers, not once in each. Read from the step's graph as MLX writes
it (`mx.export_to_dot`), with `semantic_kernels` (conftest.py) for our CUDA kernels."""
from __future__ import annotations

import mlx.core as mx
from cuda_compile import graph_operations
from test_decode_kernels import DENSE
from test_linear_mode import quantized_model
from test_traced_step import TRACED

from engine.compute import ComputePath
from engine.step_measure import filled_cache


def traced_step_operations(model) -> list[str]:
    """The operations of `model`'s one-token step over an 8-bit cache, replayed from its trace."""
    traced = ComputePath(model, kernels=TRACED, compiled=True)
    cache = filled_cache(model, DENSE, 8, 200, mx.float32)
    token = mx.array([[7]], dtype=mx.uint32)
    mx.eval(traced.forward(token, cache, "last"))  # traced here
    logits = traced.forward(token, cache, "last")  # replayed: the trace's operations
    assert (traced.decode_step.traces, traced.decode_step.fallbacks) == (1, 0)
    return graph_operations(logits)


def test_a_traced_8bit_steps_layers_share_one_array_of_sizes(tiny_model_dir, semantic_kernels):
    """Each layer's attention reads the key count and its split sizes as one int32 array; in a traced step the
    count is an array, joined to the sizes by a concatenation. The layers ask for the same one, which the trace
    keeps once: a model of one layer holds as many concatenations as the whole model (with a new sizes array in
    each layer, a 64-layer step made 64, on the GPU 128 copies)."""
    model = quantized_model(tiny_model_dir)
    assert len(model.layers) >= 2
    names = traced_step_operations(model)
    model.model.layers = model.model.layers[:1]
    one_layer = traced_step_operations(model)
    assert names.count("Concatenate") == one_layer.count("Concatenate") >= 1
    assert len(names) > len(one_layer)  # (two models: the second has fewer layers to show)


def test_a_traced_bf16_step_writes_its_rows_by_a_scatter(tiny_model_dir, semantic_kernels):
    """MLX's CUDA dynamic slice update launches a thread per element of the whole cache buffer (about 1 ms a
    layer's write at 131k rows on the H200): the bf16 trace with our kernels writes each row by a scatter, which
    launches one per element of the row (`engine.trace_caches.scattered`)."""
    from engine.decode_choice import DecodeKernels

    model = quantized_model(tiny_model_dir)
    traced = ComputePath(model, kernels=DecodeKernels(qmv=True, attention_chunk=True, step_traced_bf16=True,
                                                      source="setting"), compiled=True)
    cache = filled_cache(model, DENSE, 16, 200, mx.float32)
    token = mx.array([[7]], dtype=mx.uint32)
    mx.eval(traced.forward(token, cache, "last"))
    names = graph_operations(traced.forward(token, cache, "last"))
    assert (traced.decode_step.traces, traced.decode_step.fallbacks) == (1, 0)
    assert "DynamicSliceUpdate" not in names
    assert names.count("ScatterAxis") == 2 * len(model.layers)  # keys and values, each layer
