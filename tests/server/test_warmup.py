"""Background warm-up after start-up and after edits (per-file debounce, preemption); the context view.

Warm-up end to end (`codectx/warmth`) runs on a server of its own; the context view and
reset share the module's server; debounce and preemption are checked in process
through the core.
"""
from __future__ import annotations

import asyncio

from lsprotocol import types

from server.core.features import ask as ask_feature
from server.core.host import SessionHost
from server.core.session import LoadingSession
from server.core.settings import parse_settings
from server.core.warmup import Warmup
from server.lsp.convert import UTF16
from server.lsp.documents import DocumentStore
from tests.server.harness import command, default_options, in_process_session, open_document, start
from tests.server.shared_server import SHARED, close_document


def finished(client) -> list:
    """Warmth notifications sent after a finished warm-up (progress ones carry `prefilled`)."""
    return [w for w in client.warmth if not hasattr(w, "prefilled")]


async def next_finished(client, seen: int):
    """Waits until more than `seen` warm-ups have finished; returns the last state."""
    while len(finished(client)) <= seen:
        await client.wait_for_notification("codectx/warmth")
    return finished(client)[-1]


def watch_warmth(client) -> None:
    client.warmth = []

    @client.feature("codectx/warmth")
    def on_warmth(params):
        client.warmth.append(params)


def big_module(functions: int) -> str:
    return "\n".join(f"def f{i}(x):\n    return x * {i}  # {'ü' * (i % 5)}" for i in range(functions)) + "\n"


async def test_prefix_warms_up_after_start_and_after_an_edit(raw_client, tiny_model):
    watch_warmth(raw_client)
    await start(raw_client, "neovim", raw_client.root,
                default_options(tiny_model, warmup={"enabled": True, "debounceMs": 0}))
    first = await next_finished(raw_client, 0)
    assert first.warm is True and first.warmTokens == first.prefixTokens > 0 and first.runs == 1
    # The prefix and, after it, the hover lead-in (hover turn + answer header).
    assert first.lastRun.leadInTokens > 0
    assert first.lastRun.cachedTokens == 0
    assert first.lastRun.recomputedTokens == first.prefixTokens + first.lastRun.leadInTokens

    uri = open_document(raw_client, raw_client.root / "util.py")
    raw_client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="# ü\n")]))
    second = await next_finished(raw_client, 1)
    assert second.warm is True and second.runs == 2 and second.prefixTokens > first.prefixTokens
    # Only the invalidated tail was prefilled again.
    assert 0 < second.lastRun.recomputedTokens < second.prefixTokens
    assert (second.lastRun.cachedTokens + second.lastRun.recomputedTokens
            == second.prefixTokens + second.lastRun.leadInTokens)
    state = await command(raw_client, "codectx.status")
    assert state["warmup"]["warm"] is True and state["warmup"]["warmFraction"] == 1.0
    assert state["prefixVersion"] == 1 and state["engine"]["requests_served"] == 2
    context = await command(raw_client, "codectx.showContext")
    assert {row["cache"] for row in context["segments"]} == {"cached"}

    # A hover now computes only its answer start (add's quoted definition, "`add` is") after the
    # warm lead-in.
    await raw_client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(4, 5)))
    hovered = (await command(raw_client, "codectx.status"))["lastHover"]
    assert hovered["cachedTokens"] == second.prefixTokens + second.lastRun.leadInTokens
    assert hovered["recomputedTokens"] == hovered["promptTokens"] - hovered["cachedTokens"]
    assert hovered["headTokens"] < hovered["recomputedTokens"] <= hovered["headTokens"] + 2


async def test_an_ask_preempts_a_running_warm_up(workspace, tiny_model):
    """In process: the host's start-up warm-up, and an ask made while it runs."""
    (workspace / "big.py").write_text(big_module(200), encoding="utf-8")
    settings, problems = parse_settings(default_options(tiny_model, warmup={"enabled": True, "debounceMs": 0}))
    assert problems == []
    progress, finished_runs = asyncio.Event(), asyncio.Queue()
    first: list[dict] = []

    def on_warmth(state: dict) -> None:
        if "prefilled" in state:  # progress of a running warm-up
            first.append(state)
            progress.set()
        else:
            finished_runs.put_nowait(state)

    host = SessionHost(LoadingSession(settings, DocumentStore(UTF16), workspace), on_warmth)
    try:
        session = await host.load()  # starts the warm-up
        await progress.wait()  # the start-up warm-up has prefilled its first chunk
        assert first[0]["running"] is True and first[0]["prefilled"] < first[0]["prefixTokens"]
        answer = await ask_feature.ask(session, "hi", on_text=lambda text: None, max_tokens=1)
        assert finished_runs.empty()  # answered before the background warm-up ended
        assert answer.metrics["cached_tokens"] > 0  # restored what the warm-up had confirmed
        done = await finished_runs.get()
        assert done["warm"] is True and done["runs"] == 1
        assert done["lastRun"]["cachedTokens"] > 0  # the ask prefilled the rest of the prefix
    finally:
        host.close()


async def test_warm_up_is_debounced_per_file(tmp_path, tiny_model):
    """A file still being edited holds back only the prefix from its own changed segment on."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (root / name).write_text(f"def {name[0]}():\n    return '{name}'\n", encoding="utf-8")
    session = await in_process_session(default_options(tiny_model, warmup={"enabled": True}), root)
    try:
        states: asyncio.Queue = asyncio.Queue()

        def on_state(state: dict) -> None:
            if "prefilled" not in state:  # finished warm-ups only
                states.put_nowait(state)

        warmup = Warmup(session, on_state)

        warmup.schedule(0)
        assert (await states.get())["warm"] is True
        for name in ("a.py", "b.py"):
            session.documents.open(types.TextDocumentItem(
                uri=(root / name).as_uri(), language_id="python", version=2,
                text=f"def {name[0]}():\n    return '{name} edited'\n"))
            session.prompt.mark_dirty(root / name)
        warmup.schedule(3600, root / "b.py")  # still typing in b.py
        warmup.schedule(0, root / "a.py")     # a.py paused
        state = await states.get()
        keys = [s.key for s in session.prompt.prefix_segments()]
        assert keys[-2:] == ["a.py", "b.py"]  # both edited files are hot, at the tail
        assert state["pendingFiles"] == ["b.py"] and state["warm"] is False
        b_tokens = len(session.prompt.prefix_segments()[-1].token_ids)
        assert state["warmTokens"] == state["prefixTokens"] - b_tokens  # everything up to b.py

        warmup.schedule(0, root / "b.py")  # b.py paused too
        state = await states.get()
        assert state["warm"] is True and state["pendingFiles"] == []
        # b.py's segment, from the engine's checkpoint grid point before it (prefillChunk 16).
        lead_in = state["lastRun"]["leadInTokens"]  # the hover lead-in after the prefix
        assert b_tokens + lead_in <= state["lastRun"]["recomputedTokens"] < b_tokens + lead_in + 16
    finally:
        warmup.stop()
        session.close()


@SHARED
async def test_show_context_lists_the_layout(shared):
    client = shared
    await command(client, "codectx.ask", question="hi", maxTokens=1)
    result = await command(client, "codectx.showContext")
    keys = [row["key"] for row in result["segments"]]
    assert keys[0] == "system" and {"util.py", "main.py"} <= set(keys)
    assert all(row["tokens"] > 0 for row in result["segments"])
    assert {row["cache"] for row in result["segments"]} == {"cached"}  # the ask prefilled the prefix
    total = sum(row["tokens"] for row in result["segments"])
    assert f"total: {total} tokens in {len(keys)} segments; {total} tokens cached" in result["markdown"]

    # An edit: util.py's new segment is cold, what comes before it stays cached.
    uri = open_document(client, client.root / "util.py")
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)),
            text="# an edit no other test on the shared server makes\n")]))
    edited = await command(client, "codectx.showContext")
    states = [row["cache"] for row in edited["segments"]]
    changed = max(i for i, row in enumerate(edited["segments"]) if row["key"] == "util.py")
    assert states[changed] == "cold" and "cached" in states[:changed]
    close_document(client, client.root / "util.py")


@SHARED
async def test_reset_forgets_conversations(shared):
    client = shared
    first = await command(client, "codectx.ask", question="Q1", maxTokens=2)
    assert (await command(client, "codectx.reset")) == {"reset": True}
    again = await command(client, "codectx.ask", question="Q1", maxTokens=2,
                          conversationId=first["conversationId"])
    assert again["text"] == first["text"]  # no earlier turns in the prompt after reset
