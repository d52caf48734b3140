"""Hover answers and answer heads prepared in the background: used by later hovers,
interrupted by interactive work."""
from __future__ import annotations

import asyncio
import dataclasses

from lsprotocol import types

from engine.request import Priority
from server.core.features import hover
from server.core.features.hover_prefetch import HoverPrefetch
from server.core.prompt import Turn
from tests.engine.tiny_models import build_tiny_model
from tests.server.harness import command, default_options, in_process_session, open_document, start


async def test_a_hover_on_a_prepared_definition_is_answered_from_the_cache(raw_client, tiny_model):
    prepared = asyncio.Event()
    warm = asyncio.Event()

    @raw_client.feature("codectx/warmth")
    def on_warmth(params):
        if not hasattr(params, "prefilled") and params.warm:
            warm.set()
        if params.hoverPrefetch.prepared >= 1 and params.hoverPrefetch.startsPrepared >= 1:
            prepared.set()  # answers first, then the heads of what has none: the pass is done

    await start(raw_client, "neovim", raw_client.root,
                default_options(tiny_model, warmup={"enabled": True, "debounceMs": 0},
                                hover={"maxTokens": 8, "latencyBudgetMs": 60000, "prefetch": 1}))
    # Opened at once, like editors do (usually before the model is loaded): focus line 1;
    # `add` comes first in reading order, then `greet`. Preparation starts after the start-up
    # warm-up: `add`'s answer (prefetch 1), then the head of `greet`, which has no answer.
    uri = open_document(raw_client, raw_client.root / "util.py")
    await warm.wait()
    await prepared.wait()
    before = await command(raw_client, "codectx.status")
    answer = await raw_client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(3, 5)))  # def add
    after = await command(raw_client, "codectx.status")
    assert "**add** (function" in answer.contents.value and "`add` is" in answer.contents.value
    assert after["counters"]["hoverCacheHits"] == before["counters"]["hoverCacheHits"] + 1
    assert after["engine"]["requests_served"] == before["engine"]["requests_served"]  # no model call
    assert after["hoverPrefetch"]["prepared"] == 1 and after["hoverPrefetch"]["startsPrepared"] == 1

    # `greet` has only its answer head prefilled: the hover computes the one tail token.
    answer = await raw_client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(8, 5)))  # def greet
    assert "**greet** (function" in answer.contents.value and "`greet` is" in answer.contents.value
    last = (await command(raw_client, "codectx.status"))["lastHover"]
    assert last["startPrepared"] is True and last["recomputedTokens"] == 1


class FirstText:
    """The session's real backend, setting `streaming` once a PREPARE request streams text
    (a recorder around our own stack, not a stand-in: every call goes through)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.streaming = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.backend, name)

    async def generate(self, request, *, on_text=None, on_prefill=None):
        def text(piece: str) -> None:
            if request.priority == Priority.PREPARE:
                self.streaming.set()
            if on_text is not None:
                on_text(piece)
        return await self.backend.generate(request, on_text=text, on_prefill=on_prefill)


async def test_an_ask_goes_first_and_the_preparation_it_cut_then_gives_the_hovers_own_answer(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "calc.py").write_text("def double(x):\n    return 2 * x\n\n\ndef triple(x):\n    return 3 * x\n",
                                  encoding="utf-8")
    model = build_tiny_model(tmp_path / "endless", eos_token=None, hidden_size=64, num_hidden_layers=2,
                             intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)
    session = await in_process_session(default_options(
        model, warmup={"enabled": True}, hover={"maxTokens": 200, "latencyBudgetMs": 60000, "prefetch": 1,
                                                "prefetchHeads": True, "firstSentence": False}), root)
    session.backend = watched = FirstText(session.backend)
    try:
        cache = hover.HoverCache(lambda path: path.read_text(encoding="utf-8"))
        prepared = asyncio.Event()
        prefetch = HoverPrefetch(session, cache, busy=lambda: False,
                                 on_prepared=lambda: prefetch.prepared and prepared.set())

        prefetch.focus_on(root / "calc.py", 1)
        await watched.streaming.wait()  # answers come first: the one of `double` is decoding
        assert prefetch.starts == 0 and prefetch.prepared == 0
        asked = await session.generate(session.prompt.segments([Turn("user", "hi")]), max_tokens=3)
        assert asked.finish_reason == "length" and not prepared.is_set()  # the engine ran the ask first

        await prepared.wait()  # generated again after the ask
        assert prefetch.interrupted == 1 and prefetch.prepared == 1 and len(cache.answers) == 1
        site = cache.index.find("double", root / "calc.py", session.prompt.files)
        own = await hover._generate(session, cache, site, 0.0, Priority.INTERACTIVE)
        assert cache.answers[cache.key(site, session.prompt.files)] == own  # what the hover would generate
        assert len(own) > 40  # long enough that the ask cut into it
    finally:
        prefetch.stop()
        session.close()


class Requests:
    """The session's real backend, recording each request's prompt tail and stop strings
    (a recorder around our own stack, not a stand-in: every call goes through)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.seen: list = []
        self.batches: list = []
        self.batched = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.backend, name)

    async def generate(self, request, *, on_text=None, on_prefill=None):
        self.seen.append(request)
        return await self.backend.generate(request, on_text=on_text, on_prefill=on_prefill)

    def generate_batch(self, requests):
        self.seen.extend(requests)
        self.batches.append(list(requests))
        self.batched.set()
        return self.backend.generate_batch(requests)


async def test_answers_are_prepared_in_reading_order_from_the_focus_and_end_at_the_first_sentence(tmp_path):
    names = ["alpha", "beta", "gamma", "delta"]
    root = steps_repo(tmp_path, names, "+")
    session = await in_process_session(default_options(
        tiny_model_path(tmp_path), warmup={"enabled": True},
        hover={"maxTokens": 4, "latencyBudgetMs": 60000, "prefetch": 3, "prefetchHeads": False}), root)
    session.backend = recorder = Requests(session.backend)
    try:
        cache = hover.HoverCache(lambda path: path.read_text(encoding="utf-8"))
        prepared = asyncio.Event()
        prefetch = HoverPrefetch(session, cache, busy=lambda: False,
                                 on_prepared=lambda: prefetch.prepared >= 3 and prepared.set())
        prefetch.focus_on(root / "steps.py", 6)  # inside `beta` (lines 5-6): alpha is as near as gamma
        await prepared.wait()
        await prefetch._loop_task
        decode = session.tokenizer.decode
        heads = [decode(list(r.segments[-2].token_ids)) for r in recorder.seen]  # [lead-in][head][tail]
        assert [h.split("`")[-2] for h in heads] == ["beta", "gamma", "delta"]  # down the file
        assert all(set(hover.SENTENCE_ENDS) <= set(r.stop) for r in recorder.seen)
    finally:
        prefetch.stop()
        session.close()


async def test_a_batch_of_preparations_stores_what_one_by_one_preparation_stores(tmp_path):
    names = ["alpha", "beta", "gamma", "delta", "epsilon"]
    root = steps_repo(tmp_path, names, "*")
    session = await in_process_session(default_options(
        tiny_model_path(tmp_path), warmup={"enabled": True},
        hover={"maxTokens": 12, "latencyBudgetMs": 60000, "prefetch": 5, "prefetchHeads": False}), root)
    session.backend = recorder = Requests(session.backend)
    try:
        assert session.backend.backend.engine.compute.kind == "numpy-forward"  # where batches run as one
        answers = {}
        for batch in (1, 4):
            hover_settings = dataclasses.replace(session.settings.hover, prepare_batch=batch)
            session.base.settings = dataclasses.replace(session.settings, hover=hover_settings)
            cache = hover.HoverCache(lambda path: path.read_text(encoding="utf-8"))
            landed: list[int] = []
            prefetch = HoverPrefetch(session, cache, busy=lambda: False,
                                     on_prepared=lambda: landed.append(prefetch.prepared))
            prefetch.focus_on(root / "steps.py", 1)
            await prefetch._loop_task
            answers[batch] = dict(cache.answers.items())
            assert landed == [1, 2, 3, 4, 5] and prefetch.interrupted == 0 and not cache.pending
        assert answers[4] == answers[1] and len(answers[1]) == 5 and all(answers[1].values())
        assert [len(b) for b in recorder.batches] == [4]  # then the fifth alone
        decode = session.tokenizer.decode
        assert [decode(list(r.segments[-2].token_ids)).split("`")[-2] for r in recorder.batches[0]] == names[:4]
        asked = await session.generate(session.prompt.segments([Turn("user", "hi")]), max_tokens=3)
        assert asked.finish_reason in ("length", "stop")
    finally:
        session.close()


async def test_a_hover_while_preparation_runs_leaves_its_answer_to_the_next_batch(tmp_path):
    names = ["alpha", "beta", "gamma", "delta", "epsilon"]
    root = steps_repo(tmp_path, names, "-")
    session = await in_process_session(default_options(
        tiny_model_path(tmp_path), warmup={"enabled": True},
        hover={"maxTokens": 6, "latencyBudgetMs": 0, "prefetch": 5, "prepareBatch": 2, "prefetchHeads": False}), root)
    session.backend = recorder = Requests(session.backend)
    path = root / "steps.py"
    try:
        cache = hover.HoverCache(lambda p: p.read_text(encoding="utf-8"))
        session.prefetch = prefetch = HoverPrefetch(session, cache, busy=lambda: False)  # as a ReadySession holds it
        prefetch.focus_on(path, 1)
        await recorder.batched.wait()  # alpha and beta are with the engine
        answer = await hover.explain(session, cache, "epsilon", path, session.prompt.files, 17)
        files = session.prompt.files
        key = cache.key(cache.index.find("epsilon", path, files), files)
        assert hover.PENDING_LINE in answer.markdown and key not in cache.pending  # nothing started for it
        prefetch.focus_on(path, 17)  # what the language server does after every hover
        await prefetch._loop_task
        decode = session.tokenizer.decode
        batches = [[decode(list(r.segments[-2].token_ids)).split("`")[-2] for r in b] for b in recorder.batches]
        assert batches == [["alpha", "beta"], ["epsilon", "delta"]]  # then gamma alone
        assert all(r.priority == Priority.PREPARE for r in recorder.seen) and prefetch.interrupted == 0
        answer = await hover.explain(session, cache, "epsilon", path, session.prompt.files, 17)
        assert answer.source == "cache" and "`epsilon` is" in answer.markdown

        assert not prefetch.running  # no pass: a hover without an answer starts its own generation
        (root / "steps.py").write_text(path.read_text(encoding="utf-8").replace("x - 4", "x - 5"), encoding="utf-8")
        answer = await hover.explain(session, cache, "epsilon", path, files, 17)
        assert answer.source == "signature" and len(cache.pending) == 1
        await next(iter(cache.pending.values()))
        assert recorder.seen[-1].priority == Priority.INTERACTIVE
    finally:
        prefetch.stop()
        session.close()


def steps_repo(tmp_path, names, op):
    """A repository with steps.py: one two-line function per name, `return x <op> <index>`."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "steps.py").write_text("".join(f"def {n}(x):\n    return x {op} {i}\n\n\n" for i, n in enumerate(names)),
                                   encoding="utf-8")
    return root


def tiny_model_path(tmp_path):
    return build_tiny_model(tmp_path / "tiny", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                            num_attention_heads=2, num_key_value_heads=1)


def test_an_answer_cut_at_its_first_sentence_gets_its_period_back():
    start = "`f` (a.py, line 1):\n```\ndef f(): pass\n```\n`f` is"
    assert hover._explanation(start, " a function", sentence=True) == "`f` is a function."
    assert hover._explanation(start, " a function:", sentence=True) == "`f` is a function:"
    assert hover._explanation(start, " a function", sentence=False) == "`f` is a function"
