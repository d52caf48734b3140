"""Helpers for the end-to-end tests: server command, initialize, stream collection."""
from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.engine.tiny_models import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENTS = {"vscode": "visual-studio-code", "neovim": "neovim@v0.11"}

# The sample workspace every end-to-end suite (server, editors) runs against. In the server tests
# greedy decoding of the tiny model has not reached EOS within 2,000 tokens for the cancel tests'
# question here; in CI it once did in the Neovim script, which now serves a model without EOS.
SAMPLE_UTIL = '''"""Helpers."""


def add(a, b):
    """Returns a + b."""
    return a + b


def greet(name: str) -> str:
    return "Grüße, " + name + " 🙂"
'''
SAMPLE_MAIN = '''from util import add, greet


def main():
    print(greet("café"), add(1, 2))
'''


def write_sample_workspace(root: Path) -> Path:
    """Writes `util.py` and `main.py` (non-ASCII on purpose) into `root`; returns `root`."""
    (root / "util.py").write_text(SAMPLE_UTIL, encoding="utf-8")
    (root / "main.py").write_text(SAMPLE_MAIN, encoding="utf-8")
    return root


def build_server_test_model(directory: Path, **overrides) -> Path:
    """The tiny random-weight llama all end-to-end suites serve (fast enough for CI); `overrides`
    go to `build_tiny_model` (eos_token=None: a model whose answers only stop at their length)."""
    return build_tiny_model(directory, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                            num_attention_heads=2, num_key_value_heads=1, **overrides)


class Gate:
    """Holds the thread that reaches `hold` until the test opens it, so "while X runs" is a state the test
    controls, not a race; notes the threads it held."""

    def __init__(self) -> None:
        self.waiting = threading.Event()
        self.open = threading.Event()
        self.threads: list[threading.Thread] = []

    def hold(self, timeout_s: float = 60) -> None:
        self.threads.append(threading.current_thread())
        self.waiting.set()
        assert self.open.wait(timeout_s), "the test never opened the gate"

    async def reached(self, what: str, timeout_s: float = 60) -> None:
        """Waits (off the loop) until a thread is held; `what` names the step that should have got there."""
        assert await asyncio.to_thread(self.waiting.wait, timeout_s), what


def server_config() -> ClientServerConfig:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CODECTX_HOME=os.environ.get("CODECTX_HOME", "/tmp/codectx-test-home"))
    return ClientServerConfig(server_command=[sys.executable, "-m", "server.serve_cmd", "--log-level", "WARNING"],
                              server_env=env)


def collect_streams(client: LanguageClient) -> list:
    """Registers a `codectx/stream` handler on `client`; returns the list it appends to."""
    received: list = []

    @client.feature("codectx/stream")
    def on_stream(params):
        received.append(params)

    return received


async def end_session(client: LanguageClient) -> None:
    """Ends the server in whatever state the test left it: `shutdown` then `exit` after an initialize;
    `exit` alone before one (a fixture set up after the client failed), which LSP answers by exiting
    with status 1; nothing where the test ended the server itself (and awaited its exit, which sets the status
    this reads: a test that sends `exit` without awaiting it gets a second shutdown). pytest-lsp's
    `shutdown_session` sends
    nothing before an initialize, and its fixture then waits for a server that waits for its next message."""
    server = client._server  # noqa: SLF001 - pytest-lsp keeps the process here
    if server is not None and server.returncode is not None:
        return
    if client.capabilities is None and client.error is None:
        client.exit(None)
    else:
        await client.shutdown_session()


async def start(client: LanguageClient, kind: str, root: Path, options: dict,
                experimental: dict | None = None) -> types.InitializeResult:
    """Initializes `client`'s server as editor `kind` would (its recorded capabilities, with `experimental`
    in place of theirs when given)."""
    capabilities = client_capabilities(CLIENTS[kind])
    if experimental is not None:
        capabilities.experimental = experimental
    params = types.InitializeParams(capabilities=capabilities, root_uri=root.as_uri(), initialization_options=options)
    return await client.initialize_session(params)


def default_options(model: Path, **overrides) -> dict:
    options = {"model": {"name": str(model), "kvBits": 16, "prefillChunk": 16},
               "ask": {"maxTokens": 12}, "hover": {"maxTokens": 8, "latencyBudgetMs": 60000, "prefetch": 0, "prefetchHeads": False},
               "warmup": {"enabled": False}, "memory": {"archiveEnabled": False}}
    options.update(overrides)
    return options


async def command(client: LanguageClient, name: str, **arguments):
    """Runs `workspace/executeCommand` with one object argument."""
    return await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=name, arguments=[arguments]))


def start_command(client: LanguageClient, msg_id: str, name: str, **arguments):
    """Sends `workspace/executeCommand` with a known id; returns the awaitable response."""
    params = types.ExecuteCommandParams(command=name, arguments=[arguments])
    return asyncio.ensure_future(
        client.protocol.send_request_async(types.WORKSPACE_EXECUTE_COMMAND, params, msg_id=msg_id))


def cancel_request(client: LanguageClient, msg_id: str) -> None:
    """Sends `$/cancelRequest` (the client-side future stays pending for the server's answer)."""
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))


def offset_of(text: str, position: types.Position, encoding: str) -> int:
    """Code-point offset of an LSP position (independent of the server's conversion code)."""
    line_start = 0
    for _ in range(position.line):
        line_start = text.index("\n", line_start) + 1
    line = text[line_start:].split("\n", 1)[0]
    codec = {"utf-8": "utf-8", "utf-16": "utf-16-le", "utf-32": "utf-32-le"}[encoding]
    width = {"utf-8": 1, "utf-16": 2, "utf-32": 4}[encoding]
    units = 0
    for index, ch in enumerate(line):
        if units >= position.character:
            return line_start + index
        units += len(ch.encode(codec)) // width
    return line_start + len(line)


def apply_edits(text: str, edits, encoding: str) -> str:
    """Applies TextEdits (non-overlapping) to `text`."""
    spans = sorted(((offset_of(text, e.range.start, encoding), offset_of(text, e.range.end, encoding), e.new_text)
                    for e in edits), reverse=True)
    for start, end, new in spans:
        text = text[:start] + new + text[end:]
    return text


def open_document(client: LanguageClient, path: Path) -> str:
    """Sends didOpen for `path`; returns its URI."""
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
        uri=uri, language_id="python", version=1, text=path.read_text(encoding="utf-8"))))
    return uri


async def in_process_session(options: dict, root: Path):
    """A `Session` with a started engine and the server's prompt builder, no transport
    (for tests that drive warm-up or hover preparation directly). Close it when done."""
    from server.core.backend import start_backend
    from server.core.ready import workspace_prompt
    from server.core.session import LoadingSession, Session
    from server.core.settings import parse_settings
    from server.lsp.convert import UTF16
    from server.lsp.documents import DocumentStore

    settings, problems = parse_settings(options)
    assert problems == [], problems
    base = LoadingSession(settings, DocumentStore(UTF16), root)
    backend = await asyncio.to_thread(start_backend, settings)
    return Session(base, backend, workspace_prompt(base, backend.tokenizer, backend.context_length))


async def loaded_host(options: dict, root: Path):
    """A `SessionHost` over `root`, loaded with the real backend and the server's prompt,
    warm-up and hover preparation: what a server holds after start-up, without the
    transport (for feature tests through the core). Close it when done."""
    from server.core.host import SessionHost
    from server.core.session import LoadingSession
    from server.core.settings import parse_settings
    from server.lsp.convert import UTF16
    from server.lsp.documents import DocumentStore

    settings, problems = parse_settings(options)
    assert problems == [], problems
    host = SessionHost(LoadingSession(settings, DocumentStore(UTF16), root))
    await host.load()
    return host


def edit_buffer(host, path: Path, version: int, line: int, text: str) -> None:
    """What the server does on didOpen (at version 1) or didChange: `text` inserted at the
    start of 0-based `line` of `path`'s buffer, and the host told."""
    documents = host.base.documents
    if documents.by_path(path) is None:
        documents.open(types.TextDocumentItem(uri=path.as_uri(), language_id="python", version=1,
                                              text=path.read_text(encoding="utf-8")))
        host.reread(path)
    at = types.Position(line, 0)
    documents.change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=path.as_uri(), version=version),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text=text)]))
    host.changed([path])
