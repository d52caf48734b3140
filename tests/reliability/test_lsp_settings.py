"""Settings and a failed load as an editor meets them, against the real server process.

Editors send the same settings as `initializationOptions` and as the answer to
`workspace/configuration`, and Neovim sends `didChangeConfiguration` at start-up:
each problem was listed twice, in two messages. A change the loaded session cannot
take (`compute.*`, `context.*`) was ignored without a word. A failed load left the
status at "loading" forever, and its progress offered a Cancel that left the server
without a model."""
from __future__ import annotations

from tests.reliability.lsp_process import LspProcess, options, tiny_model, workspace

CONFIGURATION = {"workspace": {"configuration": True}, "window": {"workDoneProgress": True}}


def shown(process: LspProcess) -> list[str]:
    return [m["params"]["message"] for m in process.notifications("window/showMessage")]


async def test_settings_problems_are_shown_once_and_kept_settings_are_named(tmp_path):
    process = await LspProcess.start(tmp_path / "home")
    try:
        bad = options(tiny_model(), ask={"maxTokens": "many"}, bogus=1)
        process.answers["workspace/configuration"] = [bad]
        await process.initialize(workspace(tmp_path), bad, initialized=True, capabilities=CONFIGURATION)
        loaded = await process.call("workspace/executeCommand", {"command": "codectx.showContext", "arguments": []})
        assert "result" in loaded, loaded
        await process.notify("workspace/didChangeConfiguration", {"settings": None})  # the same problems again
        process.answers["workspace/configuration"] = [options(tiny_model(), bogus=1, compute={"forward": "mlx"},
                                                              context={"deny": ["*.key"]})]
        await process.notify("workspace/didChangeConfiguration", {"settings": None})
        # Handlers run in order: once the third configuration's messages are there, the second's are too.
        def third_shown() -> bool:
            messages = shown(process)
            return any("restart" in m for m in messages) and any(
                m.startswith("codectx: invalid settings") and "ask.maxTokens" not in m for m in messages)
        await process.wait_for(third_shown, "the third configuration's messages")
        messages = shown(process)
        problems = [m for m in messages if m.startswith("codectx: invalid settings")]
        assert len(problems) == 2, messages  # the first set once (not twice, not again), then the new set
        assert problems[0].count("ask.maxTokens") == 1 and problems[0].count("bogus") == 1
        assert "ask.maxTokens" not in problems[1] and "bogus" in problems[1]
        assert any("compute.*, context.*" in m for m in messages), messages
    finally:
        await process.close()


async def test_a_failed_load_is_in_the_status_and_its_progress_cannot_be_cancelled(tmp_path):
    process = await LspProcess.start(tmp_path / "home")
    try:
        await process.initialize(workspace(tmp_path), options(tmp_path / "no-such-model"), initialized=True,
                                 capabilities={"window": {"workDoneProgress": True}})
        failed = await process.call("workspace/executeCommand", {"command": "codectx.showContext", "arguments": []})
        assert "error" in failed, failed
        status = await process.status()
        assert status["ready"] is False and status["loadError"] == failed["error"]["message"]
        assert "no-such-model" in status["loadError"] and status["lastMetrics"] is None
        begin = next(m["params"]["value"] for m in process.notifications("$/progress")
                     if m["params"]["value"].get("kind") == "begin")
        assert begin["title"] == "codectx: loading model" and begin["cancellable"] is False
        # An ask that ends before it began answering (here: no model) still ends its stream, so a
        # client that keeps an entry per streaming ask can drop it.
        asked = await process.call("workspace/executeCommand", {"command": "codectx.ask",
                                                                "arguments": [{"question": "hi"}]})
        assert asked["error"]["message"] == failed["error"]["message"]
        ends = [m["params"] for m in process.notifications("codectx/stream") if m["params"]["done"]]
        assert [(e["kind"], e["finishReason"]) for e in ends] == [("ask", "error")]
        assert len([m for m in process.notifications("$/progress")
                    if m["params"]["value"].get("kind") == "end"]) == 1  # the load's: no ask progress began
    finally:
        await process.close()


async def test_no_folder_open_scans_nothing_rather_than_the_working_directory(tmp_path):
    """With no `rootUri` and no workspace folders, the server scanned the folder it was started
    in (here the codectx checkout; from a desktop launcher, the home folder)."""
    process = await LspProcess.start(tmp_path / "home")
    try:
        reply = await process.call("initialize", {"processId": None, "rootUri": None, "capabilities": {},
                                                  "initializationOptions": options(tiny_model())})
        assert "result" in reply, reply
        await process.notify("initialized", {})
        context = await process.call("workspace/executeCommand", {"command": "codectx.showContext", "arguments": []})
        files = [row for row in context["result"]["segments"] if row["kind"] in ("file", "map", "hot")]
        assert files == [], files
        assert any("no workspace folder is open" in m for m in shown(process))
    finally:
        await process.close()
