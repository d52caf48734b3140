"""Applying edits can fold the hot tail into place, a full rebuild of the layout: seconds on a large
repository. The server builds prompts on the prompt's own thread, so while a fold runs its event loop still
answers status, takes edits and cancels requests, and no edit made meanwhile is lost. A gate holds
the real fold until the test lets it go, so "while folding" is a state the test controls, not a race."""
from __future__ import annotations

import asyncio
import threading

import pytest

from context.workspace import Workspace
from server.core.features import ask as ask_feature
from server.core.features import status as status_feature
from tests.server.harness import Gate, default_options, edit_buffer, loaded_host, write_sample_workspace


class FoldGate(Gate):
    """`Workspace.build` that, for a fold, waits until the test opens the gate."""

    def build_method(self):
        """What replaces `Workspace.build` (a function, so that it binds as a method)."""
        build = Workspace.build

        def gated(workspace: Workspace, fold: bool = False):
            if fold:
                self.hold(30)
            return build(workspace, fold=fold)
        return gated


async def test_a_fold_runs_off_the_event_loop(tiny_model, tmp_path, monkeypatch):
    repo = write_sample_workspace(tmp_path)
    # Focus off: the prefix gets what the tiny model's 4,096 tokens leave an ask, which the grown file fits.
    host = await loaded_host(default_options(tiny_model, focus={"enabled": False}), repo)
    session = host.ready_now()
    gate = FoldGate()
    monkeypatch.setattr(Workspace, "build", gate.build_method())
    try:
        # A file that grows past the hot tail's share of the budget: the next prompt folds it into place.
        grown = "".join(f"def step_{i}(x):\n    return x + {i}\n\n\n" for i in range(80))
        edit_buffer(host, repo / "util.py", 2, 0, grown)
        asking = asyncio.ensure_future(ask_feature.ask(session, "What does add do?", on_text=lambda text: None,
                                                       max_tokens=2))
        # Reached while the fold is held: the loop runs (on the loop, the fold would hold this test too).
        await gate.reached("the edit did not fold", 30)
        assert threading.current_thread() not in gate.threads
        assert status_feature.status(host.base, session, "utf-16", {})["ready"] is True
        edit_buffer(host, repo / "main.py", 2, 0, "# edited while the fold ran\n")
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        assert not gate.open.is_set()  # the cancel did not wait for the fold

        gate.open.set()
        answer = await ask_feature.ask(session, "What does main do?", on_text=lambda text: None, max_tokens=2)
        assert answer.finish_reason in ("stop", "length")
        texts = "".join(s.text for s in session.prompt.workspace.layout.segments)
        assert "def step_79(x):" in texts and "# edited while the fold ran" in texts
        assert len(gate.threads) >= 1 and threading.current_thread() not in gate.threads
    finally:
        gate.open.set()
        host.close()


async def test_a_cancelled_reindex_still_warms_the_rescanned_prefix(tiny_model, tmp_path, monkeypatch):
    """`codectx.reindex` cancelled while its rescan runs: the rescan goes on, and the prefix version and the
    warm-up that follow a rescan still come (nothing else would warm the rebuilt prefix before the next edit)."""
    repo = write_sample_workspace(tmp_path)
    host = await loaded_host(default_options(tiny_model), repo)
    session = host.ready_now()
    gate = FoldGate()
    monkeypatch.setattr(Workspace, "build", gate.build_method())
    rescanned = asyncio.Event()
    after = type(session)._rescanned
    monkeypatch.setattr(type(session), "_rescanned", lambda self, rescan: (after(self, rescan), rescanned.set()))
    scheduled: list[float] = []
    monkeypatch.setattr(session.warmup, "schedule", lambda delay_s, path=None: scheduled.append(delay_s))
    try:
        version = host.base.prefix_version
        reindexing = asyncio.ensure_future(session.reindex())
        await gate.reached("the reindex did not rebuild", 30)
        reindexing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reindexing
        gate.open.set()
        await asyncio.wait_for(rescanned.wait(), 30)
        assert host.base.prefix_version == version + 1 and scheduled == [0]
    finally:
        gate.open.set()
        host.close()
