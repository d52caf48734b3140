"""Engine behaviour on a tiny random-weight model: equivalences, cancel, order, stops.

Tolerances, measured on the tiny llama (float32, CPU, 700-token prompt,
last-position logits spanning about ±12):
- chunked vs one-shot prefill: max |diff| 0.0 to 7.3e-5 depending on the BLAS
  threads' summation order; asserted <= 1e-3.
- 8-bit vs 16-bit KV: max |diff| 0.27; asserted < 0.5, plus the same greedy
  tokens over 24 steps.
"""
from __future__ import annotations

import threading

import mlx.core as mx
import pytest
from mlx_lm.models.cache import QuantizedKVCache

from engine.engine import Engine
from engine.errors import EngineClosedError
from engine.generate import chunk_spans, decode, prefill
from engine.kv import cache_offset, make_cache
from engine.request import DoneEvent, Priority, PromptSegment, Request, SamplingParams, TokenEvent
from engine.sampling import greedy
from tiny_models import corpus


def _chat(tiny_loaded, text="def add(a, b):\n    return a + b\n"):
    tok = tiny_loaded.tokenizer
    return tok.encode(tok.render_chat([{"role": "user", "content": text}]))


@pytest.fixture(scope="module")
def long_ids(tiny_loaded):
    """About 700 tokens of Python source."""
    return tiny_loaded.tokenizer.encode(corpus()[:4000])[:700]


def _run(engine, request, **kw):
    events = list(engine.submit(request, **kw))
    assert sum(isinstance(e, DoneEvent) for e in events) == 1 and isinstance(events[-1], DoneEvent)
    return [e for e in events if isinstance(e, TokenEvent)], events[-1]


# -- prefill / KV numerics ----------------------------------------------------

def test_chunk_spans_restart_at_boundaries():
    assert chunk_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_spans(10, 4, boundaries=[3, 10, 42]) == [(0, 3), (3, 7), (7, 10)]
    with pytest.raises(ValueError):
        chunk_spans(10, 0)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_equals_one_shot(tiny_loaded, long_ids, chunk):
    model = tiny_loaded.model
    one_shot = prefill(model, make_cache(model), long_ids, chunk_size=len(long_ids))
    cache = make_cache(model)
    chunked = prefill(model, cache, long_ids, chunk_size=chunk, boundaries=[100, 333])
    assert cache_offset(cache) == len(long_ids)
    assert mx.abs(chunked - one_shot).max().item() <= 1e-3


def test_a_chunk_is_built_while_the_one_before_runs_and_queued_after_it(tiny_loaded, long_ids, monkeypatch):
    """The host builds chunk n + 1's graph before it waits for chunk n, and queues n + 1 only once n has finished
    (a chunk's write is in place only when nothing queued holds the buffer); each chunk's checkpoint position is
    reported after it is queued. MLX's calls are wrapped (not ours) to see their order; the logits are the
    one-shot prefill's (within test_chunked_prefill_equals_one_shot's tolerance)."""
    model = tiny_loaded.model
    expected = prefill(model, make_cache(model), long_ids, chunk_size=len(long_ids))
    events = []
    calls = {"forward": model.__call__, "synchronize": mx.synchronize, "async_eval": mx.async_eval}
    monkeypatch.setattr(type(model), "__call__", lambda self, *a, **k: events.append("build") or calls["forward"](
        *a, **k))
    monkeypatch.setattr(mx, "synchronize", lambda *a: events.append("wait") or calls["synchronize"](*a))
    monkeypatch.setattr(mx, "async_eval", lambda *a: events.append("queue") or calls["async_eval"](*a))
    cache = make_cache(model)
    logits = prefill(model, cache, long_ids, chunk_size=200, boundaries=[100],
                     on_chunk=lambda done, total: events.append(done))
    chunks = len(chunk_spans(len(long_ids), 200, [100]))
    assert events[:4] == ["build", "queue", 100, "build"] and events[4] == "wait"
    assert events.count("build") == chunks and events.count("wait") == chunks - 1
    assert events.count("queue") == chunks - 1 and events[-1] == len(long_ids)  # the last chunk: evaluated
    assert mx.abs(logits - expected).max().item() <= 1e-3


def test_kv8_close_to_kv16_and_same_greedy_tokens(tiny_loaded, long_ids):
    model = tiny_loaded.model
    runs = {}
    for bits in (16, 8):
        cache = make_cache(model, kv_bits=bits)
        logits = prefill(model, cache, long_ids, chunk_size=64)
        runs[bits] = (cache, logits, list(decode(model, cache, logits, greedy, 12)))
    cache8 = runs[8][0]
    # Quantized from token 0, not after mlx-lm's 5000-token threshold.
    assert all(isinstance(c, QuantizedKVCache) and c.bits == 8 for c in cache8)
    assert cache8[0].keys[0].dtype == mx.uint32
    assert mx.abs(runs[8][1] - runs[16][1]).max().item() < 0.5
    assert runs[8][2] == runs[16][2]


def test_decode_stops_at_eos_without_yielding_it(tiny_loaded):
    model, ids = tiny_loaded.model, _chat(tiny_loaded)
    cache = make_cache(model)
    free = list(decode(model, cache, prefill(model, cache, ids), greedy, 20))
    eos = free[5]
    cache = make_cache(model)
    stopped = list(decode(model, cache, prefill(model, cache, ids), greedy, 20, eos_token_ids={eos}))
    assert stopped == free[: free.index(eos)]


# -- requests -----------------------------------------------------------------

def test_request_streams_tokens_then_one_done(engine, tiny_loaded):
    ids = _chat(tiny_loaded)
    tokens, done = _run(engine, Request(prompt_ids=ids, max_tokens=12))
    assert done.finish_reason == "length"
    assert done.text == "".join(e.text for e in tokens) and done.text
    assert sum(len(e.token_ids) for e in tokens) <= 12
    m = done.metrics
    assert (m.prompt_tokens, m.recomputed_tokens, m.cached_tokens, m.decode_tokens) == (len(ids), len(ids), 0, 12)
    assert m.prefill_s > 0 and m.decode_s > 0 and 0 < m.ttft_s
    assert engine.stats()["requests_served"] == 1


def test_reading_a_finished_handle_again_ends_at_once(engine, tiny_loaded):
    handle = engine.submit(Request(prompt_ids=_chat(tiny_loaded), max_tokens=3))
    first = list(handle)
    assert isinstance(first[-1], DoneEvent)
    assert list(handle) == [] and handle.result() is first[-1] and handle.done


def test_max_tokens_zero_only_prefills(engine, tiny_loaded):
    tokens, done = _run(engine, Request(prompt_ids=_chat(tiny_loaded), max_tokens=0))
    assert tokens == [] and done.finish_reason == "length" and done.metrics.decode_tokens == 0
    assert done.metrics.recomputed_tokens == len(_chat(tiny_loaded))


def test_segments_prompt_equals_plain_ids(engine, tiny_loaded, long_ids):
    segments = [PromptSegment("file", "a.py", tuple(long_ids[:50])),
                PromptSegment("question", "q", tuple(long_ids[50:90]))]
    _, by_segments = _run(engine, Request(segments=segments, max_tokens=10))
    _, by_ids = _run(engine, Request(prompt_ids=long_ids[:90], max_tokens=10))
    assert by_segments.text == by_ids.text


def test_stop_string_straddling_token_deltas_is_cut(engine, tiny_loaded):
    ids = _chat(tiny_loaded)
    tokens, free = _run(engine, Request(prompt_ids=ids, max_tokens=30))
    # A 3-char stop string whose first occurrence starts on the last char of one
    # delta and runs into the next.
    candidates = []
    for i in range(1, len(tokens)):
        cut = sum(len(e.text) for e in tokens[:i]) - 1
        stop = free.text[cut: cut + 3]
        if len(stop) == 3 and len(tokens[i].text) >= 2 and free.text.find(stop) == cut:
            candidates.append(stop)
    assert candidates, "the tiny model's output has no straddling 3-char string"
    stop = candidates[0]
    tokens, done = _run(engine, Request(prompt_ids=ids, max_tokens=30, stop=(stop,)))
    assert done.finish_reason == "stop"
    assert done.text == free.text[: free.text.find(stop)]
    assert stop not in "".join(e.text for e in tokens)


def test_seeded_sampling_is_reproducible(engine, tiny_loaded):
    sampling = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    texts = [_run(engine, Request(prompt_ids=_chat(tiny_loaded), max_tokens=16, sampling=sampling))[1].text
             for _ in range(2)]
    assert texts[0] == texts[1] and texts[0]


def test_generate_text_matches_streamed_text(engine, tiny_loaded):
    _, done = _run(engine, Request(prompt_ids=_chat(tiny_loaded, "hello"), max_tokens=8))
    assert engine.generate_text("hello", max_tokens=8) == done.text


async def test_async_iteration_yields_same_events(engine, tiny_loaded):
    request = Request(prompt_ids=_chat(tiny_loaded), max_tokens=8)
    events = [e async for e in engine.submit(request)]
    assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason == "length"
    assert events[-1].text == "".join(e.text for e in events[:-1])


def test_error_in_request_ends_with_error_and_engine_stays_usable(engine, tiny_loaded):
    _, done = _run(engine, Request(prompt_ids=[], max_tokens=4))
    assert done.finish_reason == "error" and isinstance(done.error, ValueError)
    _, ok = _run(engine, Request(prompt_ids=_chat(tiny_loaded), max_tokens=4))
    assert ok.finish_reason == "length"
    assert engine.stats()["requests_failed"] == 1


def test_a_cache_that_cannot_roll_back_is_rebuilt_and_the_engine_keeps_serving(engine, tiny_loaded, long_ids):
    """A layer that cannot be copied or trimmed by position (mlx-lm's ring cache, what Gemma's sliding
    layers had before `SlidingKVCache`) fails the request and its rollback; the engine answers the
    request with the error, starts its live cache afresh and serves the next request as a fresh
    engine would."""
    from mlx_lm.models.cache import RotatingKVCache

    expected = _run(Engine(tiny_loaded, prefill_chunk=16), Request(prompt_ids=_chat(tiny_loaded), max_tokens=8))[1]
    engine.prefix.cache[0] = RotatingKVCache(max_size=8)
    _, failed = _run(engine, Request(prompt_ids=long_ids, max_tokens=4))
    assert failed.finish_reason == "error" and failed.error is not None
    assert not any(isinstance(c, RotatingKVCache) for c in engine.prefix.cache)
    _, after = _run(engine, Request(prompt_ids=_chat(tiny_loaded), max_tokens=8))
    assert (after.finish_reason, after.text) == (expected.finish_reason, expected.text)


# -- cancel, order, concurrency ------------------------------------------------

def test_cancel_during_prefill_then_next_request_matches_fresh(engine, tiny_loaded, long_ids):
    after = Request(prompt_ids=_chat(tiny_loaded), max_tokens=16)
    _, fresh = _run(engine, after)
    request = Request(prompt_ids=long_ids, max_tokens=16)

    seen = []

    def cancel_after_four_chunks(done, total):
        seen.append(done)
        if done == 64:
            engine.cancel(request.request_id)

    tokens, done = _run(engine, request, on_progress=cancel_after_four_chunks)
    assert done.finish_reason == "cancelled" and tokens == []
    assert seen == [16, 32, 48, 64]  # checked before the 5th chunk
    _, again = _run(engine, Request(prompt_ids=after.prompt_ids, max_tokens=16))
    assert again.text == fresh.text and again.finish_reason == fresh.finish_reason


def test_cancel_during_decode_then_next_request_matches_fresh(engine, tiny_loaded):
    after = Request(prompt_ids=_chat(tiny_loaded, "x = 1"), max_tokens=16)
    _, fresh = _run(engine, after)
    handle = engine.submit(Request(prompt_ids=_chat(tiny_loaded), max_tokens=3000))
    events = []
    for event in handle:
        events.append(event)
        if isinstance(event, TokenEvent):
            handle.cancel()
            handle.cancel()  # idempotent
    done = events[-1]
    assert done.finish_reason == "cancelled" and done.metrics.decode_tokens < 3000
    assert done.text == "".join(e.text for e in events[:-1])
    _, again = _run(engine, Request(prompt_ids=after.prompt_ids, max_tokens=16))
    assert again.text == fresh.text
    engine.cancel(handle.request_id)  # finished id: ignored
    engine.cancel("no-such-request")
    assert engine.stats()["requests_cancelled"] == 1


def _block_worker(engine, tiny_loaded, then=None):
    """Submit a request whose first prefill chunk blocks the worker until released.

    `then` runs on the worker right after the release (once).
    """
    started, release = threading.Event(), threading.Event()

    def hold(done, total):
        if started.is_set():
            return
        started.set()
        release.wait()
        if then is not None:
            then()

    handle = engine.submit(Request(prompt_ids=_chat(tiny_loaded), max_tokens=1), on_progress=hold)
    started.wait()
    return handle, release


def test_priority_then_fifo_order(engine, tiny_loaded):
    blocker, release = _block_worker(engine, tiny_loaded)
    order = []
    plan = [("bg1", Priority.BACKGROUND), ("ia1", Priority.INTERACTIVE),
            ("bg2", Priority.BACKGROUND), ("ia2", Priority.INTERACTIVE)]
    handles = []
    for name, priority in plan:
        def record(done, total, name=name):
            if not order or order[-1] != name:
                order.append(name)
        request = Request(prompt_ids=_chat(tiny_loaded), max_tokens=1, priority=priority, request_id=name)
        handles.append(engine.submit(request, on_progress=record))
    assert engine.stats()["queued"] == 4
    release.set()
    assert all(h.result().finish_reason == "length" for h in [blocker, *handles])
    assert order == ["ia1", "ia2", "bg1", "bg2"]


def test_interactive_request_preempts_background_prefill(engine, tiny_loaded, long_ids):
    background = Request(prompt_ids=long_ids[:400], max_tokens=6, priority=Priority.BACKGROUND)
    interactive = Request(prompt_ids=_chat(tiny_loaded), max_tokens=6)
    with Engine(tiny_loaded, prefill_chunk=16) as other:  # its own, cold prefix cache
        solo = {r.request_id: _run(other, Request(prompt_ids=r.prompt_ids, max_tokens=6))[1].text
                for r in (background, interactive)}
    order, handles = [], {}

    def background_progress(done, total):
        order.append(("bg", done))
        if len(order) == 2:  # arrives mid-prefill, from the worker thread itself
            handles["ia"] = engine.submit(interactive, on_progress=lambda d, t: order.append(("ia", d)))

    handles["bg"] = engine.submit(background, on_progress=background_progress)
    bg_done = handles["bg"].result()
    ia_done = handles["ia"].result()
    names = [name for name, _ in order]
    first_ia = names.index("ia")
    # The background yielded at the chunk boundary right after the arrival...
    assert names[:first_ia] == ["bg", "bg"]
    # ...the interactive request ran whole, then the background resumed and finished.
    assert set(names[first_ia:first_ia + names[first_ia:].count("ia")]) == {"ia"}
    assert names[-1] == "bg" and order[-1][1] == 400
    assert (bg_done.finish_reason, ia_done.finish_reason) == ("length", "length")
    assert bg_done.text == solo[background.request_id] and ia_done.text == solo[interactive.request_id]


def test_concurrent_submissions_are_serialized_and_match_solo(engine, tiny_loaded, long_ids):
    prompts = {"a": long_ids[:200], "b": _chat(tiny_loaded)}
    solo = {k: _run(engine, Request(prompt_ids=v, max_tokens=12))[1].text for k, v in prompts.items()}
    progress = []
    results = {}

    def submit(key):
        request = Request(prompt_ids=prompts[key], max_tokens=12)
        results[key] = _run(engine, request, on_progress=lambda d, t: progress.append(key))[1]

    threads = [threading.Thread(target=submit, args=(k,)) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {k: r.text for k, r in results.items()} == solo
    # One request's chunks never interleave with the other's.
    runs = [k for i, k in enumerate(progress) if i == 0 or progress[i - 1] != k]
    assert sorted(runs) == ["a", "b"]


def test_close_cancels_running_and_queued_then_refuses(tiny_loaded):
    engine = Engine(tiny_loaded, prefill_chunk=16)
    blocker, release = _block_worker(engine, tiny_loaded, then=engine.close)
    queued = engine.submit(Request(prompt_ids=_chat(tiny_loaded), max_tokens=4))
    release.set()  # the worker itself closes the engine after its first chunk
    engine.close()  # joins the worker
    assert blocker.result().finish_reason == "cancelled"
    assert queued.result().finish_reason == "cancelled"
    with pytest.raises(EngineClosedError):
        engine.submit(Request(prompt_ids=[1], max_tokens=1))


# -- parity with mlx-lm, sampling and stop-string units -----------------------------

def test_greedy_tokens_match_mlx_lm_generate_step(engine, tiny_loaded):
    from mlx_lm.generate import generate_step

    ids = _chat(tiny_loaded)
    tokens, done = _run(engine, Request(prompt_ids=ids, max_tokens=16))
    ours = [t for e in tokens for t in e.token_ids]
    steps = generate_step(mx.array(ids), tiny_loaded.model, max_tokens=16)
    reference = [int(token) for token, _ in steps]
    assert ours == reference[: len(ours)] and len(ours) == done.metrics.decode_tokens == 16


def test_engine_with_8bit_kv_serves_requests(tiny_loaded):
    with Engine(tiny_loaded, kv_bits=8, prefill_chunk=16) as engine8:
        _, done = _run(engine8, Request(prompt_ids=_chat(tiny_loaded), max_tokens=6))
        assert done.finish_reason == "length" and done.text
        assert engine8.stats()["kv_bits"] == 8
    with pytest.raises(ValueError):
        Engine(tiny_loaded, kv_bits=4)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    from engine.sampling import top_p_filter

    logits = mx.array([[0.0, 3.0, 1.0, 2.0]])  # softmax ≈ .032 .644 .087 .237
    kept = lambda p: [i for i, v in enumerate(top_p_filter(logits, p).tolist()[0]) if v > -1e30]
    assert kept(0.5) == [1]
    assert kept(0.85) == [1, 3]
    assert kept(0.9) == [1, 2, 3]
    assert kept(1.0) == [0, 1, 2, 3]


@pytest.mark.parametrize("stops", [("END",), ("zz", "END"), ("E",)])
def test_stop_strings_cut_at_first_stop_for_every_split(stops):
    from engine.generate import StopStrings

    text = "abc ENx zENDq END tail"
    first = min(i for i in (text.find(s) for s in stops) if i >= 0)
    for size in range(1, 6):
        filt = StopStrings(stops)
        out = "".join(filt.push(text[i:i + size]) for i in range(0, len(text), size)) + filt.flush()
        assert out == text[:first] and filt.stopped, (size, out)
    plain = StopStrings(("nope",))
    assert plain.push("no") == "" and plain.push("pe!") == "" and plain.stopped
    again = StopStrings(("nope",))
    assert again.push("no") + again.push("t ") + again.flush() == "not "
