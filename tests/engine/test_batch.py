"""`Engine.submit_batch`: answers sharing a prefix generated together (engine.batch, engine.batch_forward).

Every row must be the answer its request gets on its own: the same greedy tokens, text and
finish reason as a serial `Engine.submit`, on the tiny llama model through the NumPy forward.
"""
from __future__ import annotations

import threading

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from checkpoint_helpers import ask, cold, repo_segments
from engine import state
from engine.batch import common_segments
from engine.batch_forward import TreeLayout, _rope, tree_forward
from engine.compute import ComputeOptions
from engine.engine import Engine
from engine.kv import make_cache
from engine.request import DoneEvent, Priority, PromptSegment, Request, SamplingParams, TokenEvent

LOGIT_TOLERANCE = 1e-4
"""Float32: a batched call sums the same products in another order than a serial one (other matmul
shapes, other attention lengths), so logits differ in their last bits. On the tiny model (logits
up to ~16 in magnitude, ~3 on average) the largest difference measured was 3.3e-5."""

HEADS = [
    "`wrap` (textwrap.py, line 1):\n```\ndef wrap(text, width=70):\n```\n`wrap`",
    "`dedent` (textwrap.py, line 9):\n```\ndef dedent(text):\n    return text\n```\n`dedent`",
    "`capwords` (string.py, line 3):\n```\ndef capwords(s, sep=None):\n```\n`capwords`",
    "`Template` (string.py, line 40):\n```\nclass Template:\n```\n`Template`",
]


@pytest.fixture(scope="module")
def lead(tiny_loaded):
    """The shared lead-in: a repository prefix, a hover-like question and the response header."""
    return ask(tiny_loaded.tokenizer, repo_segments(tiny_loaded.tokenizer), "Explain one symbol.")


def rows_of(tokenizer, lead, heads=HEADS):
    """`[lead][head][tail]` per head, as hovers lay out their answers."""
    return [[*lead, PromptSegment("answer", "hover", tuple(tokenizer.encode(head))),
             PromptSegment("answer", "hover-tail", tuple(tokenizer.encode(" is")))] for head in heads]


def events_of(handle):
    events = list(handle)
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids], done


def serial(engine, requests):
    return [events_of(engine.submit(r)) for r in requests]


def same_answer(a, b):
    """(tokens, DoneEvent) pairs that say the same thing to a caller."""
    return a[0] == b[0] and (a[1].finish_reason, a[1].text) == (b[1].finish_reason, b[1].text)


# -- the forward -----------------------------------------------------------------------------

def test_tree_forward_gives_each_row_its_serial_logits(engine, tiny_loaded, lead):
    forward, model, tok = engine.compute.numpy_forward, tiny_loaded.model, tiny_loaded.tokenizer
    assert forward is not None  # the engine's path on this CPU: the NumPy forward
    prefix = [t for s in lead for t in s.token_ids]
    suffixes = [[t for s in row[len(lead):] for t in s.token_ids] for row in rows_of(tok, lead)]
    expected_first, expected_step, tokens = [], [], []
    for suffix in suffixes:
        cache = make_cache(model)
        forward(mx.array([prefix]), cache, logits="none")
        first = np.asarray(forward(mx.array([suffix]), cache, logits="last"))[0, -1]
        tokens.append(int(np.argmax(first)))
        expected_first.append(first)
        expected_step.append(np.asarray(forward(mx.array([[tokens[-1]]]), cache, logits="last"))[0, -1])

    cache = make_cache(model)
    forward(mx.array([prefix]), cache, logits="none")
    layout = TreeLayout(len(prefix))
    owners = [row for row, suffix in enumerate(suffixes) for _ in suffix]
    ends = list(np.cumsum([len(s) for s in suffixes]) - 1)
    placed = layout.place(owners)
    assert placed.positions.tolist() == [len(prefix) + i for s in suffixes for i in range(len(s))]
    first = tree_forward(forward, cache, [t for s in suffixes for t in s], placed, ends)
    assert [int(np.argmax(row)) for row in first] == tokens
    placed = layout.place(range(len(suffixes)))  # one decode step of every row
    assert placed.positions.tolist() == [len(prefix) + len(s) for s in suffixes]
    step = tree_forward(forward, cache, tokens, placed, range(len(suffixes)))
    np.testing.assert_allclose(first, np.stack(expected_first), rtol=0, atol=LOGIT_TOLERANCE)
    np.testing.assert_allclose(step, np.stack(expected_step), rtol=0, atol=LOGIT_TOLERANCE)
    assert state.attention_offset(cache) == len(prefix) + sum(map(len, suffixes)) + len(suffixes)


def test_a_rope_that_takes_one_offset_ropes_each_run_alike(tiny_loaded):
    rope = tiny_loaded.model.model.layers[0].self_attn.rope
    assert type(rope) is nn.RoPE

    class OneOffset(nn.RoPE):  # not known to take a vector of offsets: roped per run of positions
        pass

    other = OneOffset(rope.dims, traditional=rope.traditional, base=rope.base, scale=rope.scale)
    x = np.random.default_rng(0).standard_normal((7, 2, 1, 64)).astype(np.float32)
    positions = np.array([40, 41, 42, 40, 41, 43, 44], dtype=np.int32)
    vector, runs = _rope(rope, x, positions, mx.array(positions)), _rope(other, x, positions, mx.array(positions))
    np.testing.assert_allclose(np.asarray(vector), np.asarray(runs), rtol=0, atol=1e-6)
    one = np.asarray(rope(mx.array(x[3:5]).transpose(2, 1, 0, 3), offset=40))  # a plain scalar-offset call
    np.testing.assert_allclose(np.asarray(vector)[3:5], one.transpose(2, 1, 0, 3), rtol=0, atol=1e-6)


def test_the_layout_masks_other_rows_and_later_tokens_and_skips_rows_no_token_sees():
    layout = TreeLayout(3)
    placed = layout.place([0, 1, 0])
    assert placed.positions.tolist() == [3, 3, 4] and (placed.start, placed.bias.shape) == (3, (3, 6))
    assert (placed.bias[:, :3] == 0).all()  # the prefix, for everyone
    assert np.isneginf(placed.bias[:, 3:]).tolist() == [[False, True, True], [True, False, True],
                                                        [False, True, False]]
    placed = layout.place([1])
    assert placed.positions.tolist() == [4] and placed.start == 4  # row 0's first token is skipped
    assert np.isneginf(placed.bias[0]).tolist() == [False] * 3 + [False, True, False]
    placed = layout.place([2, 2])  # a new row: after everything placed so far
    assert placed.positions.tolist() == [3, 4] and placed.start == 7 and placed.bias.shape == (2, 5)
    assert np.isneginf(placed.bias[:, 3:]).tolist() == [[False, True], [False, False]]


def test_common_segments_leave_each_row_a_token_of_its_own(tiny_loaded, lead):
    rows = rows_of(tiny_loaded.tokenizer, lead)
    requests = [Request(segments=r) for r in rows]
    assert common_segments(requests) == len(lead)
    assert common_segments([Request(segments=rows[0]), Request(segments=rows[0])]) == len(lead) + 1
    assert common_segments([Request(segments=lead), Request(segments=rows[0])]) == len(lead) - 1
    assert common_segments([Request(prompt_ids=[1, 2]), Request(prompt_ids=[1, 3])]) == 0


# -- the engine ------------------------------------------------------------------------------

def test_each_row_is_the_answer_its_request_gets_alone(engine, tiny_loaded, lead):
    requests = [Request(segments=r, max_tokens=12, priority=Priority.PREPARE)
                for r in rows_of(tiny_loaded.tokenizer, lead)]
    alone = serial(engine, [Request(segments=r.segments, max_tokens=12) for r in requests])
    progress = []
    batch = [events_of(h) for h in engine.submit_batch(requests, on_progress=lambda d, t: progress.append((d, t)))]
    assert all(same_answer(b, a) for b, a in zip(batch, alone)), (batch, alone)
    assert any(done.text for _, done in batch)
    suffixes = [len(r.all_token_ids()) - sum(len(s.token_ids) for s in lead) for r in requests]
    # One batch: the lead-in came from its checkpoint, each row computed only its own tokens.
    assert [done.metrics.recomputed_tokens for _, done in batch][1:] == suffixes[1:]
    assert progress[-1] == (sum(len(s.token_ids) for s in lead) + sum(suffixes),) * 2
    assert engine.stats()["queued"] == 0 and engine.stats()["running"] is None


def test_rows_end_on_their_own_length_stop_string_and_loop(tmp_path):
    from tiny_models import build_tiny_model

    from engine.loading import load_model

    # At weight scale 1.5 greedy decoding loops on some of these heads and not on others.
    endless = load_model(str(build_tiny_model(tmp_path / "endless", eos_token=None, weight_scale=1.5)),
                         progress=False)
    tok = endless.tokenizer
    lead = ask(tok, repo_segments(tok), "Explain one symbol.")
    rows = rows_of(tok, lead)
    guard = SamplingParams(loop_guard=True)
    with Engine(endless, prefill_chunk=16) as engine:
        free = serial(engine, [Request(segments=r, max_tokens=80, sampling=guard) for r in rows])
        looping = [i for i, (_, done) in enumerate(free) if done.finish_reason == "repetition"]
        assert looping, [done.text for _, done in free]
        stop_row = next(i for i in range(1, len(rows)) if i not in looping)
        stop = free[stop_row][1].text[6:9]  # a stop string met after a few tokens
        requests = [Request(segments=r, max_tokens=[3, 80, 80, 80][i], sampling=guard, priority=Priority.PREPARE,
                            stop=(stop,) if i == stop_row else ()) for i, r in enumerate(rows)]
        alone = serial(engine, [Request(segments=r.segments, max_tokens=r.max_tokens, sampling=guard, stop=r.stop)
                                for r in requests])
        batch = [events_of(h) for h in engine.submit_batch(requests)]
    assert all(same_answer(b, a) for b, a in zip(batch, alone)), (batch, alone)
    reasons = [done.finish_reason for _, done in batch]
    assert reasons[0] == "length" and reasons[stop_row] == "stop" and "repetition" in reasons
    assert batch[0][1].metrics.decode_tokens == 3 and stop not in batch[stop_row][1].text
    loop = batch[reasons.index("repetition")][1].metrics
    assert loop.loop_period > 0 and loop.loop_tokens >= 24


def test_the_live_cache_after_a_batch_is_the_cache_before_it(engine, tiny_loaded, lead):
    rows = rows_of(tiny_loaded.tokenizer, lead)
    assert engine.submit(Request(segments=lead, max_tokens=0)).result().finish_reason == "length"
    cache = engine.prefix.cache
    length = state.attention_offset(cache)
    before = state.copy_kv_span(cache, 0, length)
    checkpoints = [(c["kind"], c["end"]) for c in engine.prefix.stats()["checkpoint_list"]]
    handles = engine.submit_batch([Request(segments=r, max_tokens=6, priority=Priority.PREPARE) for r in rows])
    assert all(h.result().finish_reason in ("length", "stop") for h in handles)
    assert state.attention_offset(cache) == length == engine.prefix.store.line_offset
    after = state.copy_kv_span(cache, 0, length)
    assert all(mx.array_equal(before[k], after[k]).item() for k in before)
    assert [(c["kind"], c["end"]) for c in engine.prefix.stats()["checkpoint_list"]] == checkpoints
    tokens, done = events_of(engine.submit(Request(segments=rows[2], max_tokens=8)))
    assert tokens == cold(tiny_loaded, rows[2]) and done.metrics.cached_tokens == length


def test_interactive_work_goes_first_and_unfinished_rows_end_cancelled(engine, tiny_loaded, lead):
    tok = tiny_loaded.tokenizer
    rows = rows_of(tok, lead)
    handles = {}

    def progress(done, total):
        if done == total and "ia" not in handles:  # prefill done: it arrives before the first forward of decode
            handles["ia"] = engine.submit(Request(prompt_ids=tok.encode("x = 1"), max_tokens=2))

    requests = [Request(segments=r, max_tokens=1 if i == 0 else 40, priority=Priority.PREPARE)
                for i, r in enumerate(rows)]
    batch = [events_of(h) for h in engine.submit_batch(requests, on_progress=progress)]
    assert handles["ia"].result().finish_reason in ("length", "stop")
    first, *rest = batch
    assert first[1].finish_reason in ("length", "stop") and len(first[0]) <= 1  # finished: keeps its answer
    assert [done.finish_reason for _, done in rest] == ["cancelled"] * len(rest)
    assert all(done.metrics.decode_tokens == 1 for _, done in rest)  # the free first token, no forward after
    assert same_answer(first, serial(engine, [Request(segments=rows[0], max_tokens=1)])[0])
    assert events_of(engine.submit(Request(segments=rows[1], max_tokens=4)))[1].finish_reason in ("length", "stop")


def test_a_batch_still_prefilling_yields_and_resumes(engine, tiny_loaded, lead):
    tok = tiny_loaded.tokenizer
    rows = rows_of(tok, lead)
    order, handles = [], {}

    def progress(done, total):
        order.append("batch")
        if len(order) == 1:
            handles["ia"] = engine.submit(Request(prompt_ids=tok.encode("y = 2"), max_tokens=2),
                                          on_progress=lambda d, t: order.append("ia"))

    requests = [Request(segments=r, max_tokens=8, priority=Priority.PREPARE) for r in rows]
    batch = [events_of(h) for h in engine.submit_batch(requests, on_progress=progress)]
    assert handles["ia"].result().finish_reason in ("length", "stop")
    assert order[:2] == ["batch", "ia"] and order[-1] == "batch"  # yielded at once, then resumed
    alone = serial(engine, [Request(segments=r, max_tokens=8) for r in rows])
    assert all(same_answer(b, a) for b, a in zip(batch, alone))


def test_a_row_cancelled_on_its_own_leaves_the_others(engine, tiny_loaded, lead):
    rows = rows_of(tiny_loaded.tokenizer, lead)
    requests = [Request(segments=r, max_tokens=8, priority=Priority.PREPARE) for r in rows]

    def progress(done, total):
        if done == total:
            engine.cancel(requests[1].request_id)

    batch = [events_of(h) for h in engine.submit_batch(requests, on_progress=progress)]
    assert batch[1][1].finish_reason == "cancelled" and batch[1][0] == []
    alone = serial(engine, [Request(segments=r, max_tokens=8) for r in rows])
    assert all(same_answer(b, a) for i, (b, a) in enumerate(zip(batch, alone)) if i != 1)


def test_elsewhere_the_requests_run_one_by_one(tiny_loaded, lead):
    rows = rows_of(tiny_loaded.tokenizer, lead)
    with Engine(tiny_loaded, prefill_chunk=16, compute=ComputeOptions(forward="mlx")) as mlx_engine:
        assert mlx_engine.compute.numpy_forward is None
        handles = mlx_engine.submit_batch([Request(segments=r, max_tokens=6) for r in rows])
        batch = [events_of(h) for h in handles]
        assert all(done.metrics.cached_tokens > 0 for _, done in batch[1:])  # each restored the lead-in itself
        alone = serial(mlx_engine, [Request(segments=r, max_tokens=6) for r in rows])
    assert all(same_answer(b, a) for b, a in zip(batch, alone))


def test_bad_batches_are_refused_and_lose_nothing(engine, tiny_loaded, lead):
    rows = rows_of(tiny_loaded.tokenizer, lead)
    twice = Request(segments=rows[0], max_tokens=2)
    with pytest.raises(ValueError, match="already in flight"):
        engine.submit_batch([twice, Request(segments=rows[1], max_tokens=2), twice])
    assert engine.stats()["queued"] == 0
    tokens, done = events_of(engine.submit(Request(segments=rows[0], max_tokens=4)))
    assert done.finish_reason in ("length", "stop") and engine.submit_batch([]) == []


def test_a_queued_batch_whose_rows_were_all_cancelled_ends_them_at_once(engine, tiny_loaded, lead):
    rows = rows_of(tiny_loaded.tokenizer, lead)
    started, release = threading.Event(), threading.Event()

    def hold(done, total):
        started.set()
        release.wait()

    blocker = engine.submit(Request(prompt_ids=[1, 2, 3], max_tokens=0), on_progress=hold)
    started.wait()
    requests = [Request(segments=r, max_tokens=4, priority=Priority.PREPARE) for r in rows]
    handles = engine.submit_batch(requests)
    for request in requests:
        engine.cancel(request.request_id)
    release.set()
    assert blocker.result().finish_reason == "length"
    assert [events_of(h) for h in handles] == [([], h.result()) for h in handles]
    assert [h.result().finish_reason for h in handles] == ["cancelled"] * len(rows)
    assert engine.stats()["requests_cancelled"] == len(rows) and engine.stats()["queued"] == 0
    assert events_of(engine.submit(Request(segments=rows[0], max_tokens=4)))[1].finish_reason in ("length", "stop")
