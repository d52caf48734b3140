"""Start-up over stdio: capabilities, encodings, settings, progress, document sync."""
from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from tests.server.harness import command, default_options, start


async def status(client) -> dict:
    return await command(client, "codectx.status")


async def test_capabilities_and_negotiated_encoding(client):
    caps = client.init_result.capabilities
    expected = "utf-8" if client.kind == "neovim" else "utf-16"
    assert caps.position_encoding == expected
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    assert {"codectx.ask", "codectx.status", "codectx.showContext"} <= set(caps.execute_command_provider.commands)
    result = await status(client)
    assert result["positionEncoding"] == expected


async def test_model_load_reports_progress_and_becomes_ready(client):
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="codectx.ask", arguments=[{"question": "hi", "maxTokens": 1}]))
    result = await status(client)
    assert result["ready"] is True and result["model"]
    load = next(reports for token, reports in client.progress_reports.items() if str(token).startswith("codectx-load"))
    assert [r.kind for r in load] == ["begin", "report", "end"]
    assert load[0].title == "codectx: loading model" and load[1].message.startswith("scanning ")


async def test_invalid_settings_show_message_and_fall_back(raw_client, tiny_model):
    options = default_options(tiny_model, hover={"latencyBudgetMs": "soon"}, bogus=1)
    await start(raw_client, "vscode", raw_client.root, options)
    # The message is sent before the model loads, so a finished ask has seen it.
    await command(raw_client, "codectx.ask", question="hi", maxTokens=1)
    text = raw_client.messages[0].message
    assert "hover.latencyBudgetMs" in text and "bogus" in text
    result = await status(raw_client)
    assert result["positionEncoding"] == "utf-16"


async def test_unknown_command_is_invalid_params(client):
    with pytest.raises(JsonRpcException) as info:
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="codectx.nope", arguments=[]))
    assert info.value.code == -32602 and "codectx.nope" in info.value.message


async def test_bad_ask_arguments_are_invalid_params(client):
    with pytest.raises(JsonRpcException) as info:
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="codectx.ask", arguments=[{"question": ""}]))
    assert info.value.code == -32602


async def test_missing_model_is_reported(raw_client, tmp_path):
    await start(raw_client, "vscode", raw_client.root,
                {"model": {"name": str(tmp_path / "no-such-model")}})
    with pytest.raises(JsonRpcException) as info:
        await raw_client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="codectx.ask", arguments=[{"question": "hi"}]))
    assert info.value.code == -32001 and "no-such-model" in info.value.message
    assert any(m.type == types.MessageType.Error for m in raw_client.messages)


async def test_configuration_change_applies_without_restart(client):
    client.set_configuration({"ask": {"maxTokens": 2}, "hover": {"maxTokens": "many"}}, section="codectx")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)
    assert "hover.maxTokens" in client.messages[-1].message
    result = await command(client, "codectx.ask", question="Explain greet.")
    assert result["metrics"]["decode_tokens"] <= 2


async def test_window_settings_reach_the_engine(client):
    await command(client, "codectx.ask", question="Explain greet.", maxTokens=1)
    again = await command(client, "codectx.ask", question="Explain greet.", maxTokens=1)
    assert again["metrics"]["cached_tokens"] > 0
    state = await status(client)
    assert state["engine"]["window"] == {"enabled": True, "global_tokens": 8192, "window_tokens": 8192,
                                         "dense_tail": 2048, "continuation_tail": 128, "form": "block"}

    window = {"globalTokens": 16, "windowTokens": 32, "denseTailTokens": 8, "continuationTailTokens": 4}
    client.set_configuration({"window": window, "hover": {"maxTokens": "many"}}, section="codectx")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)  # sent once the settings are applied
    windowed = await command(client, "codectx.ask", question="Explain greet.", maxTokens=1)
    assert windowed["metrics"]["cached_tokens"] == 0  # checkpoints of the old policy are not reused
    state = await status(client)
    assert state["engine"]["window"] == {"enabled": True, "global_tokens": 16, "window_tokens": 32,
                                         "dense_tail": 8, "continuation_tail": 4, "form": "block"}
