"""The load-time measurement of a whole decode step replayed from its trace (`engine.decode_choice`'s
``step_traced`` and ``step_traced_bf16``), and the filled caches it runs on.

On the H200 building a decode step's graph in Python and submitting it took as long as the whole
step (docs/benchmarks.md, *GPU engine*). `engine.compiled` can replay a one-token step over 8-bit or bf16
caches from one trace, our kernels in it (`engine.trace_caches`), so no Python runs for the model
during a step. Whether that is faster is measured here, on the model itself, with the kernels already
chosen (`time_traced_step`): `STEPS` one-token steps over about `TRACE_KEYS` rows of 8-bit cache (and of
bf16 cache), queued as decode queues them (each step built from the previous step's lazy token), the
plain forward against the traced one. The traced step is checked first, over three steps from equal caches: replayed from one
trace (not falling back), and at every step the plain step's logits and every layer's written row
(within `decode_measure.MAX_ERROR`: a trace may fuse operations the plain step runs apart). Over bf16 caches
the plain step it is checked against attends with the trace's kernel (`decode_kernels.one_query_chunk`),
after that kernel's one-query call was held to MLX's (`chunk_measure.check_chunk_one_query`): on the H200 the
64-layer step checked against MLX's attention differed by 5.5e-2 (docs/benchmarks.md, twelfth session).
What a trace can save is the host's part, whose operations are the same at any context length; what it may
add can grow with the context, so the caches are not short. MLX 0.32's CUDA dynamic slice update (a bf16 traced
step's row write, `engine.trace_caches.BufferCache`) launches a thread per element of the whole cache buffer,
not of the row: about 1 ms a write at 131,072 rows on the H200 (136.6 ms a 64-layer step, twelfth session's
profile e), 8 µs at 1,024 rows, where the saved host time (about 5 ms a step) would have hidden it. At
`TRACE_KEYS` such a write costs about 8.5 ms a step, and a trace with it loses to the plain step, as at 131k.
(The bf16 trace now writes by a scatter, `engine.trace_caches.scattered`; the length guards against the next
such cost.) The two caches of a measurement are freed, and MLX's cache of freed buffers emptied, when it ends:
at `TRACE_KEYS` a 64-layer model's two bf16 caches hold 4 GiB.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import mlx.core as mx

from engine.compiled import CompiledDecodeStep
from engine.chunk_measure import check_chunk_one_query
from engine.decode_measure import Timings, attention_shape, check_close, compute_dtype
from engine.timing import best_seconds

logger = logging.getLogger(__name__)

TRACE_KEYS = 8192
STEPS = 8
Forward = Callable[[mx.array, list], mx.array]
"""A one-token forward: (tokens (1, 1), cache) -> logits (1, 1, vocab)."""


def filled_cache(model: Any, policy: Any, bits: int, rows: int, dtype: mx.Dtype = mx.bfloat16) -> list:
    """The model's window caches (`bits` 16 or 8) holding `rows` random positions, evaluated, the buffers
    the caches' alone (their first one-row write may go in place). The buffers' rows past `rows` are
    random too, not zeros: an attention that read past the key count would not go unseen."""
    from engine.window import make_window_cache

    _, kv_heads, dim = attention_shape(model)
    cache = make_window_cache(model, policy, kv_bits=bits)
    for i, c in enumerate(cache):
        k = mx.random.normal((1, kv_heads, rows, dim), key=mx.random.key(10 + i)).astype(dtype)
        c.store.write(0, k, k)
        keys = c.store.buffers()[0]
        spare = (keys[0] if isinstance(keys, tuple) else keys).shape[2] - rows
        if spare:
            past = mx.random.normal((1, kv_heads, spare, dim), key=mx.random.key(100 + i)).astype(dtype)
            c.store.write(rows, past, past)
        c.offset = rows
        mx.eval(c.store.buffers())
    return cache


TRACED = (("step_traced", 8, "q8", "kv_write"), ("step_traced_bf16", 16, "dense", "attention_chunk"))
"""The traced steps measured: (name, cache bits, store kind in the trace, the kernel it needs chosen)."""


def time_traced_step(model: Any, kernels: Any, baseline: Any = None) -> Timings:
    """"step_traced" (8-bit caches) and "step_traced_bf16" (bf16 caches): seconds per one-token step,
    plain against traced (module docstring), with `kernels` (an `engine.decode_choice.DecodeKernels`) as
    chosen; each only where they hold the kernel its trace needs (the in-place write, the chunk attention),
    and left out where its traced step fails its check. `baseline`: the kernels the plain step runs (default
    `kernels`; `engine.decode_choice.FOR_THE_TRACE`: a kernel the trace holds that lost alone is not in it)."""
    if attention_shape(model) is None:
        return {}
    kernels.wire(model)
    timings: Timings = {}
    for name, bits, kind, needs in TRACED:
        if getattr(kernels, needs):
            timings.update(_time_traced(model, kernels, name, bits, kind, baseline or kernels))
    return timings


def _time_traced(model: Any, kernels: Any, name: str, bits: int, kind: str, baseline: Any) -> Timings:
    from engine import decode_kernels
    from engine.window import WindowPolicy

    def plain(tokens: mx.array, cache: list) -> mx.array:
        with baseline.scope(tokens.size):
            return model(tokens, cache=cache)

    inside = dataclasses.replace(kernels, **{name: True})  # the switches the trace is made under

    def reference(tokens: mx.array, cache: list) -> mx.array:
        """The plain step computing as the trace does, under the trace's switches (its kernels, a write held
        for it included, not the timed baseline's; its MLPs not compiled apart, `DecodeKernels.scope`): over
        8-bit caches its keys split over the buffers' rows as the trace's are (`decode_kernels.split_as_traced`);
        over bf16 caches our chunk kernel attends the traced step's one query where MLX's attends the plain
        step's. Each kernel is held to MLX's on its own (`engine.decode_measure`), but 64 random layers amplify
        any change of rounding: on the H100 the 8-bit plain step with its MLPs compiled apart (the residual
        added outside the down projection) and the trace differed by 4.9e-2, the same trace and the plain step
        computing as it does by 0.0, and the plain step and MLX's kernels alone by 9e-2 (docs/benchmarks.md,
        sixteenth session, run j)."""
        attending = decode_kernels.one_query_chunk() if kind == "dense" else decode_kernels.split_as_traced()
        with inside.scope(tokens.size, traced=True), attending:
            return model(tokens, cache=cache)

    traced = CompiledDecodeStep(model, 1, fallback=plain, scope=lambda rows: inside.scope(rows, traced=True),
                                ours=frozenset({kind}))
    try:
        # Rows end inside the buffers with room for the steps: their writes are in place, not a regrowth.
        caches = [filled_cache(model, WindowPolicy(enabled=False), bits, TRACE_KEYS - 4 * STEPS, compute_dtype(model))
                  for _ in range(2)]
        if kind == "dense":
            check_chunk_one_query(model)
        check_traced_step(reference, traced, *caches, name=name)
        return {name: (_seconds_per_step(plain, caches[0]), _seconds_per_step(traced, caches[1]))}
    except Exception as err:  # noqa: BLE001 - an optimization: left out, not fatal
        logger.warning("decode kernels: traced step (%s): %s; not using it", name, err)
        return {}
    finally:
        caches = None
        mx.clear_cache()  # the caches' buffers back to the device, not kept for reuse after the load


def check_traced_step(plain: Forward, traced: CompiledDecodeStep, plain_cache: list, traced_cache: list,
                      steps: int = 3, name: str = "step_traced") -> None:
    """`steps` one-token steps of each from caches of equal contents, each step's token the plain step's
    last: the traced steps replayed from one trace (the first may make it; none falls back), and at every
    step the traced logits and every layer's written row those of the plain step. Raises RuntimeError
    otherwise."""
    token = mx.array([[1]], dtype=mx.uint32)
    fallbacks = traced.fallbacks
    for step in range(steps):
        at = plain_cache[0].offset
        expected, got = plain(token, plain_cache), traced(token, traced_cache)
        mx.eval(expected, got)
        if step == 0:
            traces = traced.traces
        if traced.fallbacks != fallbacks or traced.traces != traces:
            raise RuntimeError("the step was not replayed from its trace")
        check_close(name, got, expected, "step's logits")
        for ours, theirs in zip(traced_cache, plain_cache):  # (a row of an 8-bit store dequantized)
            for written, row in zip(ours.store.read(at, at + 1), theirs.store.read(at, at + 1)):
                check_close(name, written, row, "step's written row")
        token = mx.argmax(expected[:, -1, :], axis=-1).reshape(1, 1)


def _seconds_per_step(forward: Forward, cache: list, steps: int = STEPS) -> float:
    """Seconds per step of `steps` one-token steps queued as decode queues them, from the cache's offset."""
    start = cache[0].offset

    def queued() -> mx.array:
        for c in cache:
            c.offset = start
        token = mx.array([[1]], dtype=mx.uint32)
        for _ in range(steps):
            token = mx.argmax(forward(token, cache)[:, -1, :], axis=-1).reshape(1, 1)
            mx.async_eval(token)
        return token

    return best_seconds(queued) / steps
