"""The real `codectx serve` on stdio, driven with raw bytes (so tests can send broken frames).

`LspProcess.start` runs the command of tests/server/harness.py `server_config` with
CODECTX_HOME in a temporary directory. A task reads the server's stdout (frames
the server writes; those are well formed) into `messages`; another collects
stderr lines. Server-to-client requests (`workspace/configuration`, progress
creation) are answered with null, as a minimal client would, or with what
`answers` holds for their method. Every wait is for
the event itself (a message, a stderr line, the exit), bounded by a timeout.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import re
from pathlib import Path
from typing import Any, Callable

from bench.lsp_wire import frame, read_message
from tests.server.harness import build_server_test_model, default_options, server_config, write_sample_workspace

TIMEOUT = 30.0  # generous for a busy 2-core machine; a healthy server answers in milliseconds
_model_dir: Path | None = None


def tiny_model() -> Path:
    """The end-to-end suites' tiny model, built once per test run inside this run's CODECTX_HOME."""
    global _model_dir
    if _model_dir is None:
        _model_dir = build_server_test_model(Path(os.environ["CODECTX_HOME"]) / "lsp-reliability-model")
    return _model_dir


class LspProcess:
    """One server process and what it wrote so far."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.messages: list[dict] = []
        self.stderr: list[str] = []
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1)
        self.answers: dict[str, Any] = {}  # method -> result sent for server-to-client requests
        self._tasks = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr())]

    @classmethod
    async def start(cls, home: Path) -> LspProcess:
        config = server_config()
        env = dict(config.server_env, CODECTX_HOME=str(home))
        process = await asyncio.create_subprocess_exec(
            *config.server_command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, limit=1 << 20)
        return cls(process)

    # -- writing ------------------------------------------------------------

    async def send_raw(self, data: bytes) -> None:
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def request(self, method: str, params: Any = None, *, raw_suffix: bytes = b"") -> int:
        """Sends a request; returns its id."""
        msg_id = next(self._ids)
        await self.send_raw(frame({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
                            + raw_suffix)
        return msg_id

    async def notify(self, method: str, params: Any = None) -> None:
        await self.send_raw(frame({"jsonrpc": "2.0", "method": method, "params": params}))

    async def call(self, method: str, params: Any = None) -> dict:
        """Sends a request and waits for its response (the whole JSON-RPC message)."""
        return await self.response(await self.request(method, params))

    async def status(self) -> dict:
        """`codectx.status`'s result: proves the server still answers."""
        reply = await self.call("workspace/executeCommand", {"command": "codectx.status", "arguments": []})
        assert "result" in reply, reply
        return reply["result"]

    async def initialize(self, root: Path, options: dict | None = None, *, capabilities: dict | None = None,
                         initialized: bool = False) -> dict:
        """`initialize` (+ `initialized`, which starts loading the model, if asked)."""
        reply = await self.call("initialize", {"processId": None, "rootUri": root.as_uri(),
                                               "capabilities": capabilities or {},
                                               "initializationOptions": options or {}})
        assert "result" in reply, reply
        if initialized:
            await self.notify("initialized", {})
        return reply["result"]

    # -- waiting ------------------------------------------------------------

    async def wait_for(self, found: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
        """Waits until `found()` returns something truthy (re-checked whenever output arrives)."""
        async def until() -> Any:
            async with self._changed:
                while not (value := found()):
                    if self.process.returncode is not None and all(t.done() for t in self._tasks):
                        raise AssertionError(f"server exited ({self.process.returncode}) before {what}; "
                                             f"stderr tail: {self.stderr[-5:]}")
                    await self._changed.wait()
                return value
        try:
            return await asyncio.wait_for(until(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"no {what} within {timeout} s; stderr tail: {self.stderr[-5:]}") from None

    async def response(self, msg_id: Any, timeout: float = TIMEOUT) -> dict:
        def answer():
            return next((m for m in self.messages if m.get("id") == msg_id and "method" not in m), None)
        return await self.wait_for(answer, f"response to {msg_id!r}", timeout)

    def notifications(self, method: str) -> list[dict]:
        return [m for m in self.messages if m.get("method") == method and "id" not in m]

    async def log_line(self, pattern: str, count: int = 1) -> list[str]:
        """Waits until stderr has `count` lines matching `pattern`; returns them."""
        regex = re.compile(pattern)

        def lines():
            hits = [line for line in self.stderr if regex.search(line)]
            return hits if len(hits) >= count else None
        return await self.wait_for(lines, f"{count} stderr line(s) matching {pattern!r}")

    async def exit_code(self, timeout: float = TIMEOUT) -> int:
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"server still running {timeout} s later; stderr: {self.stderr[-5:]}") from None

    async def close(self) -> None:
        """Ends the process if a test left it running, and the reader tasks."""
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        for task in self._tasks:
            await asyncio.wait_for(task, TIMEOUT)

    # -- reading ------------------------------------------------------------

    async def _notify_change(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _read_stdout(self) -> None:
        try:
            while (message := await read_message(self.process.stdout)) is not None:
                self.messages.append(message)
                if "method" in message and "id" in message:  # a server-to-client request
                    result = self.answers.get(message["method"])
                    self.process.stdin.write(frame({"jsonrpc": "2.0", "id": message["id"], "result": result}))
                await self._notify_change()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            await self._notify_change()

    async def _read_stderr(self) -> None:
        try:
            while line := await self.process.stderr.readline():
                self.stderr.append(line.decode("utf-8", "replace").rstrip())
                await self._notify_change()
        finally:
            await self._notify_change()


def workspace(root: Path) -> Path:
    """The end-to-end suites' sample workspace."""
    return write_sample_workspace(root)


def options(model: Path, **overrides) -> dict:
    return default_options(model, **overrides)
