"""`Engine.probe`, `Engine.warm_prefix` and the PREPARE priority, on the tiny dense model.

A probe must say what a request over the same prompt will restore: wherever a
request follows, its `cached_tokens` and `miss_reason` are compared with the probe.
"""
from __future__ import annotations

import threading

import pytest

from checkpoint_helpers import ask, edit, prefix_len, repo_segments, run
from engine.engine import Engine
from engine.request import DoneEvent, Priority, Request
from engine.window import WindowPolicy

ARCHIVE_BYTES = 64 << 20


@pytest.fixture(scope="module")
def repo(tiny_loaded):
    return repo_segments(tiny_loaded.tokenizer)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path))
    return tmp_path


def test_cold_then_warm(engine, tiny_loaded, repo):
    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    total = prefix_len(layout, len(layout))
    cold = engine.probe(layout)
    assert (cold.prompt_tokens, cold.warm_tokens, cold.warm_segments, cold.miss) == (total, 0, 0, "new prefix")
    assert not cold.warm and engine.warm_prefix() == ()

    run(engine, layout)
    warm = engine.probe(layout)
    assert warm.warm and (warm.warm_tokens, warm.warm_segments, warm.miss) == (total, len(layout), None)
    assert warm.archived_tokens == 0
    assert engine.probe(repo).warm  # the prefix alone: its end is a checkpoint too
    assert engine.warm_prefix() == tuple(repo)  # the stable part of the last request

    follow_up = ask(tiny_loaded.tokenizer, repo, "And add?")
    probe = engine.probe(follow_up)
    assert probe.warm_segments == len(repo) and probe.miss.startswith("diverged at token")
    _, done = run(engine, follow_up)
    assert (done.metrics.cached_tokens, done.metrics.miss_reason) == (probe.warm_tokens, probe.miss)


def test_diverged_names_the_token_and_predicts_the_restore(engine, tiny_loaded, repo):
    tok = tiny_loaded.tokenizer
    run(engine, ask(tok, repo, "q"))
    changed = edit(repo, 3, repo[3].token_ids[:5] + (7,) + repo[3].token_ids[6:])
    layout = ask(tok, changed, "q")
    probe = engine.probe(layout)
    assert probe.miss == f"diverged at token {prefix_len(repo, 3) + 5}"
    assert probe.warm_tokens == prefix_len(repo, 3) and probe.warm_segments == 3
    _, done = run(engine, layout)
    assert (done.metrics.cached_tokens, done.metrics.miss_reason) == (probe.warm_tokens, probe.miss)
    assert engine.warm_prefix() == tuple(changed)  # the latest prefix prefilled whole


def test_evicted_branch_and_a_warm_prefix_no_longer_held(tiny_loaded, repo):
    tok = tiny_loaded.tokenizer
    with Engine(tiny_loaded, prefill_chunk=16, checkpoint_budget_bytes=0) as engine:
        first = ask(tok, repo, "q")
        run(engine, first)
        changed = edit(repo, 4, (9,) + repo[4].token_ids[1:])
        run(engine, ask(tok, changed, "q"))  # leaves first's tail: detached, then evicted (budget 0)
        probe = engine.probe(first)
        assert probe.miss == "evicted" and prefix_len(repo, 4) - 16 < probe.warm_tokens <= prefix_len(repo, 4)
        _, done = run(engine, first)
        assert (done.metrics.cached_tokens, done.metrics.miss_reason) == (probe.warm_tokens, "evicted")
        assert engine.warm_prefix() == tuple(repo)

        # A plain prompt moves the live line elsewhere; the prefix it left is evicted.
        assert engine.submit(Request(prompt_ids=tok.encode("print(1)"), max_tokens=1)).result().error is None
        assert engine.warm_prefix() == () and engine.probe(repo).miss == "evicted"


def _stall_worker(engine, tiny_loaded):
    """A request that holds the worker inside its first prefill chunk until released."""
    started, release = threading.Event(), threading.Event()

    def hold(done, total):
        started.set()
        release.wait()

    handle = engine.submit(Request(prompt_ids=tiny_loaded.tokenizer.encode("x = 1"), max_tokens=0),
                           on_progress=hold)
    started.wait()
    return handle, release


def test_policy_mismatch_after_a_window_switch(engine, tiny_loaded, repo):
    layout = ask(tiny_loaded.tokenizer, repo, "q")
    run(engine, layout)
    blocker, release = _stall_worker(engine, tiny_loaded)
    engine.set_window(WindowPolicy(global_tokens=32, window_tokens=32, dense_tail=16))
    switch = engine.submit(Request(prompt_ids=[1, 2, 3], max_tokens=1))
    engine.cancel(switch.request.request_id)  # served (the window applied), cancelled before prefill
    release.set()
    assert blocker.result().finish_reason == "length" and switch.result().finish_reason == "cancelled"
    probe = engine.probe(layout)
    assert (probe.warm_tokens, probe.miss) == (0, "policy mismatch")
    _, done = run(engine, layout)
    assert (done.metrics.cached_tokens, done.metrics.miss_reason) == (0, "policy mismatch")
    assert engine.probe(layout).warm


def test_from_the_archive_after_a_restart(home, tiny_loaded, repo):
    layout = ask(tiny_loaded.tokenizer, repo, "Where is main?")
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as first:
        run(first, layout)
    with Engine(tiny_loaded, prefill_chunk=16, archive_bytes=ARCHIVE_BYTES) as second:
        probe = second.probe(layout)
        archived = prefix_len(layout, len(layout) - 2)  # question and header are not archived
        assert (probe.warm_tokens, probe.archived_tokens, probe.miss) == (archived, archived, "new prefix")
        assert second.probe(repo).warm and second.warm_prefix() == ()  # nothing prefilled by this engine
        _, done = run(second, layout)
        assert (done.metrics.cached_tokens, done.metrics.miss_reason) == (probe.warm_tokens, probe.miss)
        after = second.probe(layout)
        assert after.warm and after.archived_tokens == 0  # now in memory
    with Engine(tiny_loaded, prefill_chunk=16, kv_bits=8, archive_bytes=ARCHIVE_BYTES) as other:
        assert other.probe(layout).miss == "policy mismatch"  # another policy archived these tokens


def test_probes_from_another_thread_while_the_engine_works(engine, tiny_loaded, repo):
    tok = tiny_loaded.tokenizer
    layouts = [ask(tok, edit(repo, i, (i + 3,) + repo[i].token_ids[1:]), f"q{i}") for i in range(1, 6)]
    handles = [engine.submit(Request(segments=segments, max_tokens=4)) for segments in layouts]
    seen = []
    while not all(h.done for h in handles):
        seen.extend(engine.probe(segments).warm_tokens for segments in layouts)
        engine.warm_prefix()
    assert all(h.result().finish_reason in ("length", "stop") for h in handles) and seen
    assert all(engine.probe(segments).warm for segments in layouts[-1:])


# -- PREPARE ----------------------------------------------------------------------

def test_prepare_runs_after_interactive_and_background(engine, tiny_loaded):
    blocker, release = _stall_worker(engine, tiny_loaded)
    order = []
    plan = [("prep1", Priority.PREPARE), ("bg1", Priority.BACKGROUND), ("ia1", Priority.INTERACTIVE),
            ("prep2", Priority.PREPARE), ("bg2", Priority.BACKGROUND)]
    handles = []
    for name, priority in plan:
        request = Request(prompt_ids=tiny_loaded.tokenizer.encode(f"# {name}"), max_tokens=1,
                          priority=priority, request_id=name)
        handles.append(engine.submit(request, on_progress=lambda d, t, name=name: order.append(name)))
    release.set()
    assert all(isinstance(h.result(), DoneEvent) for h in [blocker, *handles])
    assert [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name] == \
        ["ia1", "bg1", "bg2", "prep1", "prep2"]


@pytest.mark.parametrize("arriving", [Priority.INTERACTIVE, Priority.BACKGROUND])
def test_prepare_prefill_yields_at_a_chunk_boundary_and_resumes(engine, tiny_loaded, arriving):
    ids = tiny_loaded.tokenizer.encode("def f(x):\n    return x\n" * 20)[:160]
    order, handles = [], {}

    def progress(done, total):
        order.append(("prep", done))
        if len(order) == 2:  # arrives mid-prefill, from the worker thread itself
            other = Request(prompt_ids=ids[:40], max_tokens=2, priority=arriving)
            handles["other"] = engine.submit(other, on_progress=lambda d, t: order.append(("other", d)))

    handles["prep"] = engine.submit(Request(prompt_ids=ids, max_tokens=2, priority=Priority.PREPARE),
                                    on_progress=progress)
    prepared, other = handles["prep"].result(), handles["other"].result()
    names = [name for name, _ in order]
    assert names[:2] == ["prep", "prep"] and names[2] == "other"  # yielded right after the arrival
    assert names[-1] == "prep" and order[-1][1] == len(ids)        # then resumed and finished
    assert prepared.finish_reason in ("length", "stop") and other.finish_reason in ("length", "stop")


@pytest.mark.parametrize("priority", [Priority.PREPARE, Priority.BACKGROUND])
def test_only_prepare_yields_while_decoding(engine, tiny_loaded, priority):
    ids = tiny_loaded.tokenizer.encode("def f(x):\n    return x\n")
    handles = {}

    def progress(done, total):
        if done == total:  # after the last prefill chunk: an interactive request arrives before decode
            handles["ia"] = engine.submit(Request(prompt_ids=ids[:8], max_tokens=2))

    done = engine.submit(Request(prompt_ids=ids, max_tokens=64, priority=priority), on_progress=progress).result()
    assert handles["ia"].result().finish_reason in ("length", "stop")
    if priority == Priority.PREPARE:  # gave way at its first decode step
        assert done.finish_reason == "cancelled" and done.metrics.decode_tokens == 0
    else:                             # warm-up-like work decodes to its end, as before
        assert done.finish_reason in ("length", "stop")
