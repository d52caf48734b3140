"""LSP's order against the real server process: nothing before `initialize` but `exit`, `initialize` once,
`initialized` once. A second `initialize` used to replace the session (open buffers lost, asks that never
answered, the loaded model left behind); each extra `initialized` loaded another model."""
from __future__ import annotations

import pytest

from tests.reliability.lsp_process import LspProcess, options, tiny_model, workspace

SHOW = "window/showMessage"


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def command(name: str, *arguments) -> dict:
    return {"command": name, "arguments": list(arguments)}


def open_params(path) -> dict:
    return {"textDocument": {"uri": path.as_uri(), "languageId": "python", "version": 1, "text": path.read_text()}}


async def test_requests_before_initialize_get_server_not_initialized(tmp_path, model):
    process = await LspProcess.start(tmp_path / "home")
    root = workspace(tmp_path)
    try:
        hover = await process.call("textDocument/hover", {"textDocument": {"uri": (root / "main.py").as_uri()},
                                                          "position": {"line": 0, "character": 0}})
        status = await process.call("workspace/executeCommand", command("codectx.status"))
        for reply, method in ((hover, "textDocument/hover"), (status, "workspace/executeCommand")):
            assert reply["error"]["code"] == -32002 and f"{method} before initialize" in reply["error"]["message"]
        await process.notify("textDocument/didOpen", open_params(root / "main.py"))  # dropped, and logged
        await process.log_line("textDocument/didOpen before initialize: dropped")
        await process.initialize(root, options(model), initialized=True)
        assert (await process.status())["server"]["openDocuments"] == 0
    finally:
        await process.close()


async def test_a_second_initialize_is_refused_and_the_session_goes_on(tmp_path, model):
    process = await LspProcess.start(tmp_path / "home")
    root = workspace(tmp_path)
    try:
        await process.initialize(root, options(model), initialized=True)
        assert "result" in await process.call("workspace/executeCommand", command("codectx.showContext"))  # loaded
        await process.notify("textDocument/didOpen", open_params(root / "main.py"))
        again = await process.call("initialize", {"processId": None, "rootUri": root.as_uri(), "capabilities": {},
                                                  "initializationOptions": options(model)})
        assert again["error"]["code"] == -32600 and "initialize may only be sent once" in again["error"]["message"]
        state = await process.status()
        assert state["ready"] is True and state["server"]["openDocuments"] == 1
        asked = await process.call("workspace/executeCommand", command("codectx.ask", {"question": "Hi?",
                                                                                       "maxTokens": 2}))
        assert asked["result"]["finishReason"] in ("length", "stop"), asked
    finally:
        await process.close()


async def test_initialized_again_loads_nothing_more(tmp_path, model):
    process = await LspProcess.start(tmp_path / "home")
    try:
        await process.initialize(workspace(tmp_path), options(model), initialized=True)
        assert "result" in await process.call("workspace/executeCommand", command("codectx.showContext"))
        for _ in range(2):
            await process.notify("initialized", {})
        await process.log_line("initialized sent again: ignored", count=2)
        state = await process.status()
        assert state["ready"] is True
        assert not [m for m in process.notifications(SHOW) if "error" in m["params"]["message"].lower()]
    finally:
        await process.close()
