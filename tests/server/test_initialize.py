"""Start-up over stdio: capabilities, encodings, settings, progress, document sync.

Tests that only read what start-up did share the module's servers (`shared`,
`shared_each_kind`); those that start with their own options or change settings
start a server of their own. How window settings reach the engine is checked in
process, through the core (`SessionHost.apply_settings`).
"""
from __future__ import annotations

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from server.core.features import ask as ask_feature
from server.core.features import status as status_feature
from server.core.host import SessionHost
from server.core.session import LoadingSession
from server.core.settings import parse_settings
from server.lsp.convert import UTF16
from server.lsp.documents import DocumentStore
from tests.server.harness import command, default_options, start
from tests.server.shared_server import SHARED


async def status(client) -> dict:
    return await command(client, "codectx.status")


@SHARED
async def test_capabilities_and_negotiated_encoding(shared_each_kind):
    client = shared_each_kind
    caps = client.init_result.capabilities
    expected = "utf-8" if client.kind == "neovim" else "utf-16"
    assert caps.position_encoding == expected
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    assert {"codectx.ask", "codectx.status", "codectx.showContext"} <= set(caps.execute_command_provider.commands)
    result = await status(client)
    assert result["positionEncoding"] == expected


@SHARED
async def test_model_load_reports_progress_and_becomes_ready(shared):
    client = shared
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="codectx.ask", arguments=[{"question": "hi", "maxTokens": 1}]))
    result = await status(client)
    assert result["ready"] is True and result["model"]
    load = client.load_reports  # the `codectx-load-*` progress of the server's start-up
    assert [r.kind for r in load] == ["begin"] + ["report"] * (len(load) - 2) + ["end"]
    assert load[0].title == "codectx: loading model" and load[1].message.startswith("scanning ")
    parsed = [r.message.split()[-2].split("/") for r in load[2:-1] if ": parsing " in r.message]
    assert parsed and parsed[-1][0] == parsed[-1][1]  # files parsed: n/n at the end


async def test_invalid_settings_show_message_and_fall_back(raw_client, tiny_model):
    options = default_options(tiny_model, hover={"latencyBudgetMs": "soon"}, bogus=1)
    await start(raw_client, "vscode", raw_client.root, options)
    # The message is sent before the model loads, so a finished ask has seen it.
    await command(raw_client, "codectx.ask", question="hi", maxTokens=1)
    text = raw_client.messages[0].message
    assert "hover.latencyBudgetMs" in text and "bogus" in text
    result = await status(raw_client)
    assert result["positionEncoding"] == "utf-16"


@SHARED
async def test_unknown_command_is_invalid_params(shared):
    client = shared
    with pytest.raises(JsonRpcException) as info:
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="codectx.nope", arguments=[]))
    assert info.value.code == -32602 and "codectx.nope" in info.value.message


@SHARED
async def test_bad_ask_arguments_are_invalid_params(shared):
    client = shared
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
    assert info.value.code == -31001 and "no-such-model" in info.value.message
    assert any(m.type == types.MessageType.Error for m in raw_client.messages)


async def test_configuration_change_applies_without_restart(vscode_client, tiny_model):
    client = vscode_client
    # The whole section, as editors send it (a section without a model names the default model).
    client.set_configuration(dict(default_options(tiny_model), ask={"maxTokens": 2}, hover={"maxTokens": "many"}),
                             section="codectx")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)
    assert "hover.maxTokens" in client.messages[-1].message
    result = await command(client, "codectx.ask", question="Explain greet.")
    assert result["metrics"]["decode_tokens"] <= 2
    assert (await status(client))["model"] == (await status(client))["engine"]["model_id"] != "smollm2-135m"


@pytest.mark.parametrize("offers", [False, True], ids=["server says it", "client offers it"])
async def test_a_change_that_needs_a_restart_is_named_once(raw_client, tiny_model, offers):
    """A change to a section the loaded session keeps is named by the server, unless the client declared
    that it offers the restart itself (VS Code: one notice with a button, not two)."""
    client = raw_client
    options = default_options(tiny_model)
    await start(client, "vscode", client.root, options,
                experimental={"codectx": {"restartOffer": True}} if offers else None)
    await command(client, "codectx.ask", question="hi", maxTokens=1)  # loaded: its sections are kept from now on
    client.set_configuration(dict(options, compute={"forward": "mlx"}, hover={"maxTokens": "many"}), section="codectx")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    # The restart notice goes before the settings problems, on the same stream: once the second is here, so is
    # the first, if it was sent.
    while not any("invalid settings" in m.message for m in client.messages):
        await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)
    restart = [m.message for m in client.messages if "restart the server" in m.message]
    assert restart == ([] if offers else [restart[0]]) and (offers or "compute.*" in restart[0])


async def test_window_settings_reach_the_engine(tiny_model, workspace):
    """In process: new window settings reach the loaded engine (the transport's part,
    `workspace/didChangeConfiguration`, is the test above)."""
    settings, problems = parse_settings(default_options(tiny_model))
    assert problems == []
    host = SessionHost(LoadingSession(settings, DocumentStore(UTF16), workspace))
    session = await host.load()
    try:
        await ask(session, maxTokens=1)
        again = await ask(session, maxTokens=1)
        assert again["metrics"]["cached_tokens"] > 0
        assert engine_window(host) == {"enabled": True, "global_tokens": 8192, "window_tokens": 8192,
                                       "dense_tail": 2048, "continuation_tail": 128, "form": "block"}

        window = {"globalTokens": 16, "windowTokens": 32, "denseTailTokens": 8, "continuationTailTokens": 4}
        changed, problems = parse_settings(dict(default_options(tiny_model), window=window))
        assert problems == [] and host.apply_settings(changed) == []  # no restart needed
        windowed = await ask(session, maxTokens=1)
        assert windowed["metrics"]["cached_tokens"] == 0  # checkpoints of the old policy are not reused
        assert engine_window(host) == {"enabled": True, "global_tokens": 16, "window_tokens": 32,
                                       "dense_tail": 8, "continuation_tail": 4, "form": "block"}

        # What the loaded session was built with is kept, and named, until a restart (compute.forward
        # was ignored without a word; a new context.deny pattern too).
        built, _ = parse_settings(dict(default_options(tiny_model), window=window, compute={"forward": "mlx"},
                                       context={"deny": ["*.key"]}, ask={"maxTokens": 3}))
        assert host.apply_settings(built) == ["compute", "context"]
        assert host.base.settings.compute == settings.compute and host.base.settings.context == settings.context
        assert host.base.settings.ask.max_tokens == 3  # the rest applies at once
    finally:
        host.close()


async def ask(session, maxTokens: int) -> dict:  # noqa: N803 - the command's argument name
    result = await ask_feature.ask(session, "Explain greet.", on_text=lambda text: None, max_tokens=maxTokens)
    return result.as_dict()


def engine_window(host: SessionHost) -> dict:
    return status_feature.status(host.base, host.ready_now(), "utf-16", {})["engine"]["window"]
