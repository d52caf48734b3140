"""Room for a request's rows is made before they are written: by its prefill, by a restore, between requests.

A write past a window cache's buffers grows them over the whole history inside the forward that writes: an edit's
hot copy after the cached prefix, the answer's decode every 256 tokens (28-33 ms for a 131k-token 8-bit cache of 64
layers on an H100), and the traced decode step is traced again for the new capacity. The engine's worker now grows
them while no request waits, to `ROOM_AHEAD` positions past the offset where fewer than half are left, and a prefill
makes room for its whole prompt and `ROOM_AHEAD` more at once, and an answer that reaches the buffers' end makes
that room before its next step (or speculative round), so the next request writes where the rows already have
room, into buffers of the capacity the last one traced.
"""
from __future__ import annotations

import mlx.core as mx
import pytest

from checkpoint_helpers import ask, cold, edit, prefix_len, repo_segments, run
from engine import generate, qkv
from engine.qkv import ROOM_AHEAD
from engine.compute import ComputeOptions
from engine.engine import Engine
from engine.window import WindowKVCache, WindowPolicy, make_window_cache

WINDOW = WindowPolicy(global_tokens=16, window_tokens=32, dense_tail=16, continuation_tail=8)


def held(layer: WindowKVCache) -> int:
    """Positions its buffers hold."""
    return layer.written()[0].shape[2]


@pytest.fixture
def grows(monkeypatch) -> list[tuple[int, int]]:
    """(kept rows, new capacity) of every buffer grown (the store's own `_grow`, observed)."""
    seen: list[tuple[int, int]] = []
    grow = qkv._grow
    monkeypatch.setattr(qkv, "_grow", lambda buf, keep, capacity, like: seen.append((keep, capacity))
                        or grow(buf, keep, capacity, like))
    return seen


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_an_edit_and_its_question_write_into_room_made_between_requests(tiny_loaded, grows, kv_bits):
    tok = tiny_loaded.tokenizer
    repo = repo_segments(tok)
    first = ask(tok, repo, "Where is main?")
    edited = ask(tok, edit(repo, 3, tuple(tok.encode("def changed():\n    return 42\n"))), "What changed?")
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=kv_bits, window=WINDOW) as eng:
        run(eng, first)
        assert eng.wait_idle(60)
        caches = [c for c in eng.prefix.cache if isinstance(c, WindowKVCache)]
        assert caches and all(held(c) >= c.offset + ROOM_AHEAD // 2 for c in caches)
        grows.clear()
        tokens, done = run(eng, edited)
        assert 0 < done.metrics.cached_tokens  # restored up to the edited file, the rest written after it
        assert grows == []  # the edit's rows, its question's and the answer's: no buffer grew on the request's path
        assert eng.wait_idle(60)
        assert all(held(c) >= c.offset + ROOM_AHEAD // 2 for c in caches)  # room for the next
    assert tokens == cold(tiny_loaded, edited, kv_bits=kv_bits, window=WINDOW)


def test_making_room_stops_when_a_request_waits_and_grows_nothing_that_fits(tiny_loaded, grows):
    tok = tiny_loaded.tokenizer
    with Engine(tiny_loaded, prefill_chunk=16, window=WINDOW) as eng:
        run(eng, ask(tok, repo_segments(tok), "Where is main?"))
        assert eng.wait_idle(60)
        layers = [c for c in eng.prefix.cache if isinstance(c, WindowKVCache)]
        for layer in layers:
            layer.trim(0)  # nothing past the offset needs room now, except what the buffers already hold
        grows.clear()
        assert eng.prefix._room_ahead(stop=None) == 0 and grows == []  # it fits: nothing grows
        sizes = [held(layer) for layer in layers]
        for layer, size in zip(layers, sizes):
            layer.offset = size  # as if the last request had filled every buffer
        assert eng.prefix._room_ahead(stop=lambda: True) == len(layers) and grows == []  # a request waits
        assert [held(layer) for layer in layers] == sizes


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_a_cold_prefill_grows_the_buffers_once_for_the_whole_prompt(tiny_loaded, grows, monkeypatch, kv_bits):
    tok = tiny_loaded.tokenizer
    prompt = ask(tok, repo_segments(tok, n_files=12, file_tokens=60), "Where is main?")
    n = sum(len(s.token_ids) for s in prompt)
    assert n > 512  # its 16-row chunks cross the store's 256-position steps twice at least
    settings = dict(kv_bits=kv_bits, window=WINDOW)

    def prefill_grows() -> list[int]:
        """Rows kept by each grow of a history while the prompt was written (later ones are decode's or the
        worker's)."""
        return [keep for keep, _ in grows if 0 < keep < n]

    tokens = cold(tiny_loaded, prompt, **settings)
    arrays = 2 if kv_bits == 16 else 6  # keys and values; 8-bit: packed, scales, biases of each
    assert prefill_grows() == [16] * arrays * len(tiny_loaded.model.layers)  # once, after the first 16-row chunk
    grows.clear()
    monkeypatch.setattr(generate, "make_room", lambda *a, **k: [])  # each write grows what it needs
    assert cold(tiny_loaded, prompt, **settings) == tokens
    assert len(set(prefill_grows())) == 2  # the history grew at each 256-position step the writes crossed


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_questions_and_an_edit_after_a_cold_ask_decode_from_the_first_trace(tiny_loaded, kv_bits):
    """The traced decode step takes the buffers whole, so a new capacity is a new trace (a first token gap of
    49-94 ms against 26-42 on an H100 in `bench/gpu_engine.py`). The room made ahead keeps one capacity from request to
    request: grown to `ROOM_AHEAD` past the offset only when half of it is used. (On the CPU the one traced step is
    MLX's, which keeps no room unless told, `compute.room`: it attends over the whole buffers.)"""
    tok = tiny_loaded.tokenizer
    repo = repo_segments(tok, n_files=12, file_tokens=60)
    edited = edit(repo, 6, tuple(tok.encode("def changed():\n    return 42\n" * 4)))
    prompts = [ask(tok, repo, "Where is main?"), ask(tok, repo, "Why?"), ask(tok, edited, "What changed?"),
               ask(tok, edited, "And now?")]
    traces = []
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=kv_bits, window=WINDOW,
                compute=ComputeOptions(attention="mlx", compile=True, room="on")) as eng:
        for prompt in prompts:
            run(eng, prompt, max_tokens=24)
            assert eng.wait_idle(60)
            traces.append(eng.compute.decode_step.traces)
    assert traces == [1, 1, 1, 1]


def window_cache(model, kv_bits: int) -> list:
    return make_window_cache(model, WINDOW, kv_bits=kv_bits)


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_a_prefill_past_its_buffers_grows_them_once_before_its_first_write(tiny_loaded, grows, monkeypatch, kv_bits):
    model, ids = tiny_loaded.model, [(7 * i) % 400 + 3 for i in range(600)]
    logits, ahead = {}, qkv.Room(64)
    for room in (True, False):
        if not room:
            monkeypatch.setattr(generate, "make_room", lambda *a, **k: [])  # each write grows what it needs
        cache = window_cache(model, kv_bits)
        generate.prefill(model, cache, ids[:40], chunk_size=16, room=ahead)
        assert held(cache[0]) >= 40 + 64 or not room
        grows.clear()
        # its first chunk fits, the rest not
        logits[room] = generate.prefill(model, cache, ids[40:], chunk_size=16, room=ahead)
        kept = sorted({keep for keep, _ in grows})
        if room:  # once, before the first write
            assert kept == [40] and len(grows) == (2 if kv_bits == 16 else 6) * len(model.layers)
        else:  # at each 256-position step the writes crossed
            assert len(kept) >= 2
        assert held(cache[0]) >= 600 + 64 or not room
    assert mx.allclose(logits[True], logits[False], atol=1e-5).item()


def test_a_one_chunk_cold_prompt_gets_room_for_its_answer_up_to_the_limits_step(tiny_loaded):
    model, ids = tiny_loaded.model, list(range(3, 103))
    cache = window_cache(model, 8)
    generate.prefill(model, cache, ids, chunk_size=256)  # one chunk: its write made a 256-row buffer
    assert held(cache[0]) >= 100 + ROOM_AHEAD
    cache = window_cache(model, 8)
    generate.prefill(model, cache, ids, chunk_size=256, room=qkv.Room(limit=300))
    assert held(cache[0]) == qkv.capacity(300)  # room up to the model's context (in the store's steps)


def test_room_between_requests_stops_at_the_models_context(tiny_loaded, grows):
    tok, context = tiny_loaded.tokenizer, tiny_loaded.context_length
    prompt = ask(tok, repo_segments(tok, n_files=12, file_tokens=60), "Where is main?")
    assert sum(len(s.token_ids) for s in prompt) + ROOM_AHEAD > context
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=8, window=WINDOW) as eng:
        run(eng, prompt)
        assert eng.wait_idle(60)
        assert {held(c) for c in eng.prefix.cache} == {qkv.capacity(context)}


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_rows_restored_after_an_edit_land_in_room(tiny_loaded, grows, kv_bits):
    """Going back to a prompt from an edited one appends its saved rows (`engine.state.append_kv_spans`); they come
    with room, so the question after them is written without copying the history again."""
    tok = tiny_loaded.tokenizer
    repo = repo_segments(tok)
    first = ask(tok, repo, "Where is main?")
    edited = ask(tok, edit(repo, 1, tuple(tok.encode("def changed():\n    return 42\n"))), "What changed?")
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=kv_bits, window=WINDOW) as eng:
        for prompt in (first, edited):
            run(eng, prompt)
            assert eng.wait_idle(60)
        grows.clear()
        tokens, done = run(eng, first)
        assert done.metrics.cached_tokens > prefix_len(first, 2)  # rows after the edited file came back
        assert grows == []
    assert tokens == cold(tiny_loaded, first, kv_bits=kv_bits, window=WINDOW)


def test_going_back_from_an_edit_keeps_the_buffers_capacity_and_the_decode_steps_trace(tiny_loaded, monkeypatch):
    """A restore's room comes in the store's own steps, so rows appended on going back fill buffers of the size the
    prefill had made, and the traced decode step is not traced again (the model's context binds nothing here)."""
    monkeypatch.setattr(qkv, "ROOM_AHEAD", 1000)
    tok = tiny_loaded.tokenizer
    repo = repo_segments(tok)
    first = ask(tok, repo, "Where is main?")
    edited = ask(tok, edit(repo, 1, tuple(tok.encode("def changed():\n    return 42\n"))), "What changed?")
    assert sum(len(s.token_ids) for s in first) + 1000 < tiny_loaded.context_length
    seen = []
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=8, window=WINDOW,
                compute=ComputeOptions(attention="mlx", compile=True, room="on")) as eng:
        for prompt in (first, edited, first):
            tokens, done = run(eng, prompt)
            assert eng.wait_idle(60)
            seen.append((eng.compute.decode_step.traces, held(eng.prefix.cache[0])))
    assert done.metrics.cached_tokens > prefix_len(first, 2)  # the rows after the edited file came back
    assert len(set(seen)) == 1 and seen[0][0] == 1


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_a_traced_step_that_grows_the_buffers_keeps_only_the_rows_before_the_offset(tiny_loaded, grows, kv_bits):
    """Rows past the offset are stale (a rollback's): the grow a traced step's buffers make does not copy them."""
    from engine import trace_caches

    cache = window_cache(tiny_loaded.model, kv_bits)
    generate.prefill(tiny_loaded.model, cache, list(range(3, 259)), chunk_size=256, room=qkv.Room(limit=256))
    assert held(cache[0]) == 256  # no room past the limit
    for layer in cache:
        layer.offset = 250  # six rows rolled back
    grows.clear()
    assert trace_caches.layer_buffers(cache[0], 10) is not None
    assert grows and {keep for keep, _ in grows} == {250} and held(cache[0]) == qkv.capacity(260)


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_an_answer_past_its_buffers_grows_them_once_by_the_room_not_every_256_tokens(tiny_loaded, grows, kv_bits):
    """A prompt that ends at its buffers' end (here the prefill's limit): its answer's first step makes room
    (`ROOM_AHEAD`) where the write would have grown the buffers by 256 positions at a time."""
    from engine.request import SamplingParams
    from engine.sampling import make_sampler

    model, greedy = tiny_loaded.model, make_sampler(SamplingParams())
    cache = window_cache(model, kv_bits)
    logits = generate.prefill(model, cache, list(range(3, 259)), chunk_size=256, room=qkv.Room(limit=256))
    assert held(cache[0]) == 256
    grows.clear()
    answer = list(generate.decode(model, cache, logits, greedy, 300))
    assert len(answer) == 300  # (no EOS given)
    assert len({c for _, c in grows}) == 1 and held(cache[0]) == qkv.capacity(qkv.Room().end(257))
    cache = window_cache(model, kv_bits)  # a limit holds here too
    logits = generate.prefill(model, cache, list(range(3, 259)), chunk_size=256, room=qkv.Room(limit=256))
    list(generate.decode(model, cache, logits, greedy, 8, room=qkv.Room(limit=300)))
    assert held(cache[0]) == qkv.capacity(300)


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_a_speculative_answer_past_its_buffers_grows_them_once_by_the_room(tiny_loaded, grows, kv_bits):
    """A speculative round's verify writes its rows after making room, as a plain decode step does."""
    from engine.request import Metrics, SamplingParams
    from engine.sampling import make_sampler
    from engine.speculative import Mode
    from engine.speculative_decode import speculative_decode

    model, greedy = tiny_loaded.model, make_sampler(SamplingParams())
    prompt = [3 + i % 7 for i in range(256)]  # repeats: the lookup drafter finds drafts in it
    cache = window_cache(model, kv_bits)
    logits = generate.prefill(model, cache, prompt, chunk_size=256, room=qkv.Room(limit=256))
    assert held(cache[0]) == 256
    grows.clear()
    metrics = Metrics()
    answer = list(speculative_decode(model, cache, logits, greedy, 300, prompt_ids=prompt, mode=Mode.LOOKUP,
                                     metrics=metrics))
    assert len(answer) == 300 and metrics.drafted_tokens > 0  # rounds of more than one row were verified
    assert len({c for _, c in grows}) == 1 and held(cache[0]) >= cache[0].offset
    plain = window_cache(model, kv_bits)
    logits = generate.prefill(model, plain, prompt, chunk_size=256)
    assert answer == list(generate.decode(model, plain, logits, greedy, 300))  # the same answer


def test_the_path_keeps_no_room_where_mlxs_traced_attention_reads_the_whole_buffers(tiny_loaded):
    """MLX's attention in a trace over window caches attends over their whole buffers, room included (24-73% a step
    on this CPU, bench/room_mask.py): there `auto` keeps none; our kernels' traces and untraced steps keep it."""
    from engine.compute import choose

    model = tiny_loaded.model
    assert choose(model, ComputeOptions(attention="mlx", compile=True)).room_ahead == 0
    assert choose(model, ComputeOptions(attention="mlx", compile=True, room="on")).room_ahead == ROOM_AHEAD
    assert choose(model, ComputeOptions(attention="mlx", compile=False)).room_ahead == ROOM_AHEAD
    assert choose(model, ComputeOptions(attention="numpy", compile=True)).room_ahead == ROOM_AHEAD  # windows untraced
    assert choose(model, ComputeOptions(attention="mlx", compile=False, room="off")).room_ahead == 0
    with pytest.raises(ValueError, match="room must be one of"):
        ComputeOptions(room="more")


@pytest.mark.parametrize("kv_bits", [16, 8])
def test_an_engine_on_mlxs_traced_step_grows_its_buffers_as_writes_need_them(tiny_loaded, grows, kv_bits):
    """No room past the rows on that path: the buffers end within the store's 256-position step of the offset after
    a request and after the worker's idle work; the answers are those of a cold cache."""
    tok = tiny_loaded.tokenizer
    repo = repo_segments(tok)
    prompts = [ask(tok, repo, "Where is main?"), ask(tok, repo, "Why?")]
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=kv_bits, window=WINDOW,
                compute=ComputeOptions(attention="mlx", compile=True)) as eng:
        assert eng.compute.decode_step is not None and eng.prefix.room.ahead == 0
        answers = []
        for prompt in prompts:
            answers.append(run(eng, prompt)[0])
            assert eng.wait_idle(60)
            caches = [c for c in eng.prefix.cache if isinstance(c, WindowKVCache)]
            assert caches and all(held(c) == qkv.capacity(c.offset + 1) for c in caches)
    assert answers == [cold(tiny_loaded, p, kv_bits=kv_bits, window=WINDOW) for p in prompts]
