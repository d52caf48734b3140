"""Background warm-up after start-up and after edits; the context view."""
from __future__ import annotations

from lsprotocol import types

from tests.server.harness import command, default_options, open_document, start


async def next_warmth(client, seen: int):
    """Waits until more than `seen` codectx/warmth notifications arrived; returns the last."""
    while len(client.warmth) <= seen:
        await client.wait_for_notification("codectx/warmth")
    return client.warmth[-1]


async def test_prefix_warms_up_after_start_and_after_an_edit(raw_client, tiny_model):
    raw_client.warmth = []

    @raw_client.feature("codectx/warmth")
    def on_warmth(params):
        raw_client.warmth.append(params)

    await start(raw_client, "neovim", raw_client.root,
                default_options(tiny_model, warmup={"enabled": True, "debounceMs": 0}))
    first = await next_warmth(raw_client, 0)
    assert first.warm is True and first.prefixTokens > 0 and first.runs == 1

    uri = open_document(raw_client, raw_client.root / "util.py")
    raw_client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(0, 0), end=types.Position(0, 0)), text="# ü\n")]))
    second = await next_warmth(raw_client, 1)
    assert second.warm is True and second.runs == 2 and second.prefixTokens > first.prefixTokens
    state = await command(raw_client, "codectx.status")
    assert state["warmup"]["warm"] is True and state["prefixVersion"] == 1
    assert state["engine"]["requests_served"] == 2


async def test_show_context_lists_the_layout(client):
    result = await command(client, "codectx.showContext")
    keys = [row["key"] for row in result["segments"]]
    assert keys[0] == "system" and {"util.py", "main.py"} <= set(keys)
    assert all(row["tokens"] > 0 for row in result["segments"])
    total = sum(row["tokens"] for row in result["segments"])
    assert f"total: {total} tokens in {len(keys)} segments" in result["markdown"]


async def test_reset_forgets_conversations(client):
    first = await command(client, "codectx.ask", question="Q1", maxTokens=2)
    assert (await command(client, "codectx.reset")) == {"reset": True}
    again = await command(client, "codectx.ask", question="Q1", maxTokens=2,
                          conversationId=first["conversationId"])
    assert again["text"] == first["text"]  # no earlier turns in the prompt after reset
