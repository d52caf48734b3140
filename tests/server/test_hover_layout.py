"""A hover has one token layout whatever happened before: warm == cold at the server level.

The same hover (greedy) on a fresh server, on one where preparation prefilled
its answer head, and after other hovers, sends the engine the same tokens in
the same segments and gets the same answer; only what is restored differs.
"""
from __future__ import annotations

import asyncio

from engine.request import Priority, SegmentKind
from server.core.features import hover
from server.core.features.hover_prefetch import HoverPrefetch
from tests.server.harness import default_options, in_process_session, write_sample_workspace


class Recorder:
    """The session's real backend, keeping each interactive request with its `DoneEvent`
    (a recorder around our own stack, not a stand-in: every call goes through)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.served: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    async def generate(self, request, **kw):
        done = await self.backend.generate(request, **kw)
        if request.priority == Priority.INTERACTIVE:
            self.served.append((request, done))
        return done


async def hover_on(session, cache, name: str, root) -> tuple:
    """Hovers `name` (defined in util.py) through the feature; returns (request, done, markdown)."""
    recorder = session.backend
    before = len(recorder.served)
    answer = await hover.explain(session, cache, name, root / "util.py", session.prompt.files)
    assert answer.source == "model" and len(recorder.served) == before + 1
    request, done = recorder.served[-1]
    return request, done, answer.markdown


def layout(request) -> list[tuple]:
    return [(s.kind, s.key, tuple(s.token_ids)) for s in request.segments]


async def session_on(model, root, **hover_settings):
    session = await in_process_session(default_options(
        model, warmup={"enabled": True}, hover={"maxTokens": 12, "latencyBudgetMs": 60000, **hover_settings}), root)
    session.backend = Recorder(session.backend)
    return session


async def test_the_same_hover_is_computed_over_the_same_tokens_cold_prepared_and_after_others(tmp_path, tiny_model):
    root = write_sample_workspace(tmp_path)
    cold = await session_on(tiny_model, root)
    try:
        cold_request, cold_done, cold_text = await hover_on(cold, hover.HoverCache(cold.read_text), "add", root)
    finally:
        cold.close()
    assert cold_done.metrics.cached_tokens == 0
    kinds = [s.kind for s in cold_request.segments]
    assert kinds[-2:] == [SegmentKind.ANSWER, SegmentKind.ANSWER]  # [lead-in][head][tail]

    warm = await session_on(tiny_model, root, prefetch=0, prefetchHeads=True)
    try:
        heads = asyncio.Event()
        prefetch = HoverPrefetch(warm, hover.HoverCache(warm.read_text), busy=lambda: False,
                                 on_prepared=lambda: prefetch.starts == 2 and heads.set())
        prefetch.focus_on(root / "util.py", 4)
        await heads.wait()  # the heads of `add` and `greet` are prefilled
        prepared_request, prepared_done, prepared_text = await hover_on(
            warm, hover.HoverCache(warm.read_text), "add", root)
        head_end = prepared_done.metrics.prompt_tokens - len(prepared_request.segments[-1].token_ids)
        assert prepared_done.metrics.cached_tokens == head_end  # the prepared head was restored

        others = hover.HoverCache(warm.read_text)
        for name in ("greet", "main"):  # other hovers move the engine's live line elsewhere
            await hover.explain(warm, others, name, root / "util.py", warm.prompt.files)
        again_request, again_done, again_text = await hover_on(warm, hover.HoverCache(warm.read_text), "add", root)
        prefetch.stop()
    finally:
        warm.close()

    for request, text in ((prepared_request, prepared_text), (again_request, again_text)):
        assert request.all_token_ids() == cold_request.all_token_ids()
        assert layout(request) == layout(cold_request)
        assert text == cold_text
    assert "`add` is" in cold_text
