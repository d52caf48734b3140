"""Checkpoint identity, restore, rollback, branches and eviction on the tiny dense model.

Every "warm" answer is compared with a fresh engine's answer to the same
request (greedy): the cache must never change the answer.
"""
from __future__ import annotations

import threading

import mlx.core as mx
import pytest

from checkpoint_helpers import ask, cold, edit, prefix_len, repo_segments, restorable, run
from engine import state
from engine.boundaries import boundaries, cut_points
from engine.checkpoint_types import Miss
from engine.engine import Engine
from engine.generate import prefill
from engine.kv import make_cache
from engine.policy import CachePolicy
from engine.prefix_cache import PrefixCache
from engine.request import Metrics, PromptSegment, Request

POLICY = CachePolicy(model_id="tiny", weight_hash="w", dtype="float32")


@pytest.fixture(scope="module")
def repo(tiny_loaded):
    return repo_segments(tiny_loaded.tokenizer)


# -- identity ------------------------------------------------------------------

def test_policy_fingerprint_covers_every_field():
    base = POLICY.fingerprint()
    variants = [CachePolicy("other", "w", "float32"), CachePolicy("tiny", "w2", "float32"),
                CachePolicy("tiny", "w", "float16"), CachePolicy("tiny", "w", "float32", kv_bits=8),
                CachePolicy("tiny", "w", "float32", global_tokens=64, window_tokens=128),
                CachePolicy("tiny", "w", "float32", dense_kinds=("hot",)),
                CachePolicy("tiny", "w", "float32", prefill_chunk=1024),
                CachePolicy("tiny", "w", "float32", compute="attention=numpy forward=mlx compile=on blas=reference"),
                CachePolicy("tiny", "w", "float32", numerics_version=99)]
    prints = {v.fingerprint() for v in variants}
    assert base not in prints and len(prints) == len(variants)
    assert CachePolicy("tiny", "w", "float32").fingerprint() == base
    eight = CachePolicy("tiny", "w", "float32", kv_bits=8)
    assert CachePolicy("tiny", "w", "float32", kv_bits=8, kv_group_size=32).fingerprint() \
        != eight.fingerprint()


def test_boundary_keys_chain_over_policy_and_all_previous_tokens():
    a = [PromptSegment("system", "s", (1, 2, 3)), PromptSegment("file", "x", ()),
         PromptSegment("file", "y", (4, 5))]
    b = [PromptSegment("system", "s", (1, 2, 9)), PromptSegment("file", "y", (4, 5))]
    ba, bb = boundaries("p1", a), boundaries("p1", b)
    assert [(x.start, x.end) for x in ba] == [(0, 3), (3, 5)]  # empty segment: no boundary
    grid = boundaries("p1", a, interval=2)  # a grid across segments, anchored at the end
    assert [(x.start, x.end, x.kind) for x in grid] == [(0, 2, "system"), (2, 4, "file"), (4, 5, "file")]
    assert grid[-1].key != ba[-1].key and grid[0].parent == ""
    tail = a + [PromptSegment("question", "q", (6, 7, 8)), PromptSegment("header", "h", (9,))]
    cuts = [(x.end, x.protected) for x in boundaries("p1", tail, interval=2)]
    # Anchors: the end of the prefix (5) and the header (9), protected; the short question joins the header.
    assert cuts == [(2, False), (4, False), (5, False), (7, False), (9, True)]
    assert ba[1].parent == ba[0].key
    assert ba[1].tokens == bb[1].tokens and ba[1].key != bb[1].key  # same tail, other prefix
    other = boundaries("p2", a)
    assert other[0].key != ba[0].key and other[0].token_key == ba[0].token_key
    assert boundaries("p1", a) == ba
    salted = boundaries("p1", a, layout_key=lambda end: 0 if end < 4 else 1)
    assert salted[0].key != ba[0].key and salted[0].token_key == ba[0].token_key


# -- warm == cold ---------------------------------------------------------------

@pytest.mark.parametrize("kv_bits", [16, 8])
def test_warm_equals_cold_across_a_session(tiny_loaded, repo, kv_bits):
    tok = tiny_loaded.tokenizer
    n = len(repo)
    mid_edit = edit(repo, 2, repo[2].token_ids[:10] + tuple(tok.encode("x = 42\n")) + repo[2].token_ids[10:])
    last_edit = edit(mid_edit, n - 1, repo[n - 1].token_ids[:-3])
    continued = ask(tok, last_edit, "Next?", turns=("Last?", "It is short."))
    steps = [
        # (segments, first token that differs from every earlier prompt, expected miss reason)
        (ask(tok, repo, "What does f1 do?"), 0, "new prefix"),
        (ask(tok, repo, "And f2?"), prefix_len(repo, n), None),
        (ask(tok, mid_edit, "Now?"), prefix_len(repo, 2) + 10, f"diverged at token {prefix_len(repo, 2) + 10}"),
        (ask(tok, last_edit, "Last?"), prefix_len(last_edit, n), None),
        # The first turn repeats the last question's tokens at the same place: restored too.
        (continued, prefix_len(continued, n + 1), None),
    ]
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=kv_bits) as warm:
        seen: set[str] = set()
        for segments, diverged_at, miss in steps:
            tokens, done = run(warm, segments)
            assert tokens == cold(tiny_loaded, segments, kv_bits=kv_bits)
            m = done.metrics
            assert m.cached_tokens == restorable(warm.prefix.store, segments, seen)
            assert m.cached_tokens > diverged_at - 16  # at most one grid step recomputed
            assert m.recomputed_tokens == m.prompt_tokens - m.cached_tokens
            if miss is not None:
                assert m.miss_reason == miss
            else:
                assert m.miss_reason.startswith("diverged at token")


@pytest.mark.parametrize("kind", ["kv16", "kv8", "window16"])
def test_restored_logits_equal_cold_logits(tiny_loaded, repo, kind):
    tok, model = tiny_loaded.tokenizer, tiny_loaded.model
    first, follow = ask(tok, repo, "One?"), ask(tok, repo, "Two?")
    bits = 8 if kind == "kv8" else 16

    def fresh():
        return _window_cache(model, 16) if kind == "window16" else make_cache(model, bits)

    policy = CachePolicy("tiny", "w", "float32", kv_bits=bits)
    prefix = PrefixCache(model, policy, budget_bytes=1 << 30, cache=fresh())
    prefix.prefill(Request(segments=first), 16, lambda: False, Metrics())
    prefix.prefill(Request(segments=ask(tok, repo, "A detour")), 16, lambda: False, Metrics())
    metrics = Metrics()
    warm = prefix.prefill(Request(segments=follow), 16, lambda: False, metrics)
    ids = Request(segments=follow).all_token_ids()
    ends = cut_points(follow, policy.prefill_chunk)  # the layout's chunking, as the cache does
    cold_logits = prefill(model, fresh(), ids, 16, boundaries=ends)
    assert metrics.cached_tokens == prefix_len(follow, len(repo))
    assert mx.array_equal(warm, cold_logits)


def test_repeated_request_restores_all_but_the_question_and_header(engine, tiny_loaded, repo):
    segments = ask(tiny_loaded.tokenizer, repo, "Same?")
    first, _ = run(engine, segments)
    again, done = run(engine, segments)
    assert again == first
    # The short question and the header are one forward, the last, always recomputed.
    assert done.metrics.cached_tokens == prefix_len(segments, len(segments) - 2)
    assert done.metrics.recomputed_tokens == len(segments[-2].token_ids) + len(segments[-1].token_ids)
    assert done.metrics.miss_reason is None


# -- cancel ---------------------------------------------------------------------

def test_cancel_during_prefill_keeps_only_confirmed_state(engine, tiny_loaded, repo):
    segments = ask(tiny_loaded.tokenizer, repo, "Cancel me")
    stop_at = prefix_len(segments, 3) + 16  # a checkpoint inside the fourth segment
    request = Request(segments=segments, max_tokens=4)

    def cancel(done, total):
        if done == stop_at:
            engine.cancel(request.request_id)

    events = list(engine.submit(request, on_progress=cancel))
    assert events[-1].finish_reason == "cancelled"
    # The chunk after stop_at never ran; everything up to it was confirmed.
    assert engine.prefix.store.line_offset == stop_at
    assert state.attention_offset(engine.prefix.cache) == stop_at
    ends = [c.boundary.end for c in engine.prefix.store.checkpoints()]
    assert ends == [b.end for b in engine.prefix.store.boundaries(segments) if b.end <= stop_at]
    assert prefix_len(segments, 3) in ends and 20 in ends and 16 in ends
    tokens, done = run(engine, segments)
    assert done.metrics.cached_tokens == stop_at
    assert tokens == cold(tiny_loaded, segments)


def test_cancel_during_decode_rolls_back_to_confirmed_state(engine, tiny_loaded, repo):
    segments = ask(tiny_loaded.tokenizer, repo, "Talk a lot")
    handle = engine.submit(Request(segments=segments, max_tokens=500))
    for event in handle:
        if hasattr(event, "token_ids") and event.token_ids:
            handle.cancel()
    assert event.finish_reason == "cancelled"
    # Back to the prompt, or to the last periodic checkpoint of the answer (test_checkpoint_decode).
    kept = state.attention_offset(engine.prefix.cache) - prefix_len(segments, len(segments))
    assert kept >= 0 and kept % 16 == 0 and kept <= event.metrics.decode_tokens
    assert kept + prefix_len(segments, len(segments)) == engine.prefix.store.line_offset
    tokens, _ = run(engine, ask(tiny_loaded.tokenizer, repo, "Short"))
    assert tokens == cold(tiny_loaded, ask(tiny_loaded.tokenizer, repo, "Short"))


# -- branches -------------------------------------------------------------------

def test_branches_from_one_prefix_keep_their_tails(tiny_loaded, repo):
    tok = tiny_loaded.tokenizer
    hover, question = ask(tok, repo, "hover: f3"), ask(tok, repo, "ask: why?")
    with Engine(tiny_loaded, prefill_chunk=16) as eng:
        run(eng, question)
        run(eng, hover)
        # Back to the question's branch: the prefix is restored; the short question with its header is
        # the last forward, always recomputed.
        tokens, done = run(eng, question)
        assert done.metrics.cached_tokens == prefix_len(question, len(question) - 2)
        assert tokens == cold(tiny_loaded, question)
        branches = [c for c in eng.prefix.store.checkpoints() if c.kv is not None]
        assert {c.boundary.kind for c in branches} == {"header"}  # the hover's tail: its question and header
        # A continuation of the hover's answer restores that tail from its detached copy.
        continued = [*hover, PromptSegment("answer", "a", tuple(tok.encode(" It returns")))]
        tokens, done = run(eng, continued)
        assert done.metrics.cached_tokens == prefix_len(hover, len(hover))
        assert tokens == cold(tiny_loaded, continued)


def test_concurrent_branch_requests_all_match_cold(tiny_loaded, repo):
    tok = tiny_loaded.tokenizer
    layouts = [ask(tok, repo, q) for q in ("hover: f0", "ask: f1?", "action: fix f2", "hover: f0")]
    expected = [cold(tiny_loaded, s) for s in layouts]
    results: dict[int, list[int]] = {}
    with Engine(tiny_loaded, prefill_chunk=16) as eng:
        run(eng, layouts[0])
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run(eng, layouts[i])[0]))
                   for i in range(len(layouts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [results[i] for i in range(len(layouts))] == expected


# -- memory ---------------------------------------------------------------------

def test_nbytes_matches_the_arrays(tiny_loaded, repo):
    tok, model = tiny_loaded.tokenizer, tiny_loaded.model
    prefix = PrefixCache(model, POLICY, budget_bytes=1 << 30)
    for q in ("a?", "b?", "c?"):
        prefix.prefill(Request(segments=ask(tok, repo, q)), 16, lambda: False, Metrics())
    cps = prefix.store.checkpoints()
    branches = [c for c in cps if c.kv is not None]
    assert len(branches) == 2  # the question and header of "a?" and of "b?" (one boundary each)
    args = model.args
    per_token = 2 * args.num_hidden_layers * args.num_key_value_heads * (args.hidden_size // args.num_attention_heads) * 4
    expected = sum((c.boundary.end - c.boundary.start) * per_token for c in branches)
    assert prefix.store.nbytes == expected == sum(state.nbytes(c.kv) for c in branches)
    assert prefix.stats()["checkpoint_bytes"] == expected


def test_eviction_is_lru_with_protected_last(tiny_loaded):
    prefix = PrefixCache(tiny_loaded.model, POLICY, budget_bytes=1 << 30)
    system = PromptSegment("system", "s", tuple(range(10, 26)), protected=True)

    def layout(name, start, protected=False):
        return [system, PromptSegment("file", name, tuple(range(start, start + 16)), protected)]

    a, b, c, d = layout("a", 100, protected=True), layout("b", 200), layout("c", 300), layout("d", 400)
    for segments in (a, b, c, d):  # each new layout detaches the previous file's tail
        prefix.prefill(Request(segments=segments), 16, lambda: False, Metrics())
    store = prefix.store
    tails = {c.boundary.key: c for c in store.checkpoints() if c.kv is not None}
    keys = {name: store.boundaries(seg)[1].key for name, seg in zip("abc", (a, b, c))}
    assert set(tails) == set(keys.values())
    size = tails[keys["a"]].nbytes
    assert all(t.nbytes == size for t in tails.values())

    store.set_budget(2 * size)   # the least recently used unprotected tail goes first
    assert {k for k in keys if keys[k] in {c.key for c in store.checkpoints()}} == {"a", "c"}
    question = PromptSegment("question", "q", (7, 8))
    assert store.plan(store.boundaries(b + [question]), 10**6).miss == Miss("evicted")
    store.set_budget(size)       # the protected tail outlives a more recent one
    assert {k for k in keys if keys[k] in {c.key for c in store.checkpoints()}} == {"a"}
    store.set_budget(0)
    assert all(c.kv is None for c in store.checkpoints())
    assert store.nbytes == 0


def test_miss_reasons(tiny_loaded, repo):
    tok, model = tiny_loaded.tokenizer, tiny_loaded.model
    prefix = PrefixCache(model, POLICY, budget_bytes=1 << 30)
    m = Metrics()
    prefix.prefill(Request(segments=ask(tok, repo, "q1")), 16, lambda: False, m)
    assert m.miss_reason == "new prefix"
    changed = edit(repo, 1, (7,) + repo[1].token_ids[1:])
    m = Metrics()
    prefix.prefill(Request(segments=ask(tok, changed, "q1")), 16, lambda: False, m)
    assert m.miss_reason == f"diverged at token {prefix_len(repo, 1)}"
    assert m.cached_tokens == prefix_len(repo, 1)


# -- state round trip over every attention cache kind ------------------------------

def _window_cache(model, bits):
    from engine.window import WindowPolicy, make_window_cache

    return make_window_cache(model, WindowPolicy(), kv_bits=bits)


@pytest.mark.parametrize("make", [
    lambda m: make_cache(m, 16), lambda m: make_cache(m, 8),
    lambda m: _window_cache(m, 16), lambda m: _window_cache(m, 8),
], ids=["kv16", "kv8", "window16", "window8"])
def test_kv_span_copy_trim_append_round_trip(tiny_loaded, make):
    model = tiny_loaded.model
    ids = list(range(40, 80))
    cache = make(model)
    whole = prefill(model, cache, ids, 16)
    before = [[mx.array(x) for x in layer_parts] for layer_parts in
              ([p[..., :40, :] for p in state._kv_parts(c)] for c in cache)]
    span = state.copy_kv_span(cache, 16, 40)
    assert state.nbytes(span) > 0
    state.trim_to(cache, 16)
    assert state.attention_offset(cache) == 16
    state.append_kv_span(cache, span, 24)
    assert state.attention_offset(cache) == 40
    for c, parts in zip(cache, before):
        after = [p[..., :40, :] for p in state._kv_parts(c)]
        assert all(mx.array_equal(a, b) for a, b in zip(after, parts))
    # The restored cache continues exactly like the original would have.
    state.trim_to(cache, 16)
    state.append_kv_span(cache, span, 24)
    fresh = make(model)
    prefill(model, fresh, ids, 16)
    nxt = prefill(model, cache, [5, 6, 7], 16)
    assert mx.array_equal(nxt, prefill(model, fresh, [5, 6, 7], 16))
    assert whole.shape == nxt.shape


def test_an_empty_prompt_is_refused_as_such(tiny_loaded):
    prefix = PrefixCache(tiny_loaded.model, POLICY, budget_bytes=1 << 30)
    for request in (Request(segments=[], max_tokens=1), Request(prompt_ids=[], max_tokens=1)):
        with pytest.raises(ValueError, match="at least one token"):
            prefix.prefill(request, 16, lambda: False, Metrics())
