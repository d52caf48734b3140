"""The real language server (`python -m server.serve_cmd` over stdio) for the workspace-access tests.

`served(root, model_dir)` starts one server process with pytest-lsp's client, initializes it
on `root` with the tiny random-weight model of tests/server/harness.py and VS Code's
capabilities, and shuts it down afterwards. Every wait is for the answer itself,
bounded by `TIMEOUT` (`showContext` and `ask` wait for the model load and the scan).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import AsyncIterator

from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.server.harness import (build_server_test_model, collect_streams, command, default_options, server_config,
                                  start)

TIMEOUT = 60.0  # a busy 2-core machine; a healthy server answers these in seconds
_models: dict[str, Path] = {}


def tiny_model() -> Path:
    """The end-to-end suites' tiny model, built once per test run inside this run's CODECTX_HOME."""
    if "plain" not in _models:
        _models["plain"] = build_server_test_model(Path(os.environ["CODECTX_HOME"]) / "security-lsp-model")
    return _models["plain"]


def model_with_template(name: str, template: str) -> Path:
    """A copy of `tiny_model()` whose tokenizer_config.json carries `template` as its chat template."""
    if name not in _models:
        target = Path(os.environ["CODECTX_HOME"]) / f"security-lsp-model-{name}"
        shutil.copytree(tiny_model(), target, dirs_exist_ok=True)
        config_path = target / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["chat_template"] = template
        config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
        _models[name] = target
    return _models[name]


@contextlib.asynccontextmanager
async def served(root: Path, model_dir: Path | None = None, **overrides) -> AsyncIterator[LanguageClient]:
    """A server initialized on `root`; the client carries `.root` and `.streams`.

    Args:
        model_dir: The model folder (default `tiny_model()`).
        overrides: Top-level settings replacing those of `default_options` (a `model` dict too).
    """
    client = await server_config().start()
    client.root = root
    client.streams = collect_streams(client)
    options = default_options(model_dir or tiny_model())
    options.update(overrides)
    try:
        await asyncio.wait_for(start(client, "vscode", root, options), TIMEOUT)
        yield client
    finally:
        try:
            await asyncio.wait_for(client.shutdown_session(), TIMEOUT)
        except Exception:  # noqa: BLE001 - a failed test must not wait forever on a server that hangs
            process = client._server  # pygls's stop() waits for the process; it never ends it
            if process is not None and process.returncode is None:
                process.kill()
        await client.stop()


async def show_context(client: LanguageClient) -> dict:
    """`codectx.showContext` (waits for the load and the scan)."""
    return await asyncio.wait_for(command(client, "codectx.showContext"), TIMEOUT)


def prompt_keys(context: dict) -> set[str]:
    """Paths that have a file or hot segment in the prefix."""
    return {row["key"] for row in context["segments"] if row["kind"] in ("file", "hot")}


def skip_reasons(context: dict) -> dict[str, str]:
    """Skipped path -> reason, as `codectx.showContext` reports them."""
    return {row["path"]: row["reason"] for row in context["skipped"]}


def prefix_tokens(context: dict) -> int:
    return sum(row["tokens"] for row in context["segments"])


async def ask(client: LanguageClient, question: str = "What does add do?", **arguments) -> dict:
    """`codectx.ask`; asserts a normal answer came back."""
    result = await asyncio.wait_for(command(client, "codectx.ask", question=question, **arguments), TIMEOUT)
    assert result["finishReason"] in ("stop", "length") and result["text"], result
    return result


async def hover(client: LanguageClient, path: Path, line: int, character: int) -> types.Hover | None:
    return await asyncio.wait_for(client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=path.as_uri()),
        position=types.Position(line=line, character=character))), TIMEOUT)


def file_event(path: Path, kind: types.FileChangeType = types.FileChangeType.Created) -> types.FileEvent:
    return types.FileEvent(uri=path.as_uri(), type=kind)


def did_open(client: LanguageClient, path: Path, text: str) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=path.as_uri(), language_id="python", version=1, text=text)))


def did_close(client: LanguageClient, path: Path) -> None:
    client.text_document_did_close(types.DidCloseTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=path.as_uri())))


def did_save(client: LanguageClient, path: Path, text: str | None = None) -> None:
    client.text_document_did_save(types.DidSaveTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=path.as_uri()), text=text))
