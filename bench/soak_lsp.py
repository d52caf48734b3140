"""A minimal LSP peer over the real server's stdio, for bench/soak.py.

It frames messages itself (so the soak can also send broken frames), answers the
server's own requests (configuration, progress creation) with null, and lets callers
wait for a response, a stderr line or the end of model loading.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import re
import sys
from pathlib import Path
from typing import Any

from bench.lsp_wire import frame, read_message

ROOT = Path(__file__).resolve().parents[1]


class LspPeer:
    """The server process, the responses it sent, and its stderr."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pid = process.pid
        self._ids = itertools.count(1)
        self._waiting: dict[Any, asyncio.Future] = {}
        self._stderr: list[str] = []
        self._stderr_changed = asyncio.Event()
        self._ready = asyncio.get_running_loop().create_future()
        self._versions: dict[str, int] = {}
        self.unreadable_frames = 0  # -32700 answers with id null: one per broken frame the server skipped
        self._tasks = [asyncio.ensure_future(self._read_stdout()), asyncio.ensure_future(self._read_stderr())]

    @classmethod
    async def start(cls, home: Path, args: list[str]) -> LspPeer:
        env = dict(os.environ, CODECTX_HOME=str(home), PYTHONPATH=str(ROOT))
        env.pop("CODECTX_API_KEY", None)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "server.serve_cmd", *args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, limit=1 << 22)
        return cls(process)

    async def send_raw(self, data: bytes) -> None:
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def request(self, method: str, params: Any = None) -> int:
        msg_id = next(self._ids)
        self._waiting[msg_id] = asyncio.get_running_loop().create_future()
        await self.send_raw(frame({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}))
        return msg_id

    async def notify(self, method: str, params: Any = None) -> None:
        await self.send_raw(frame({"jsonrpc": "2.0", "method": method, "params": params}))

    async def response(self, msg_id: int, timeout: float) -> dict:
        try:
            return await asyncio.wait_for(asyncio.shield(self._waiting[msg_id]), timeout)
        finally:
            if self._waiting[msg_id].done():
                del self._waiting[msg_id]

    async def call(self, method: str, params: Any, timeout: float) -> dict:
        return await self.response(await self.request(method, params), timeout)

    async def initialize(self, root: Path, options: dict) -> None:
        capabilities = {"window": {"workDoneProgress": True},
                        "textDocument": {"synchronization": {"dynamicRegistration": False}}}
        reply = await self.call("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(),
                                               "capabilities": capabilities,
                                               "initializationOptions": options}, 60)
        if "result" not in reply:
            raise RuntimeError(f"initialize failed: {reply}")
        await self.notify("initialized", {})

    async def wait_ready(self, timeout: float) -> None:
        """Until the model-loading progress ends (its end message says "ready" or the error)."""
        message = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        if message != "ready":
            raise RuntimeError(f"the server did not load the model: {message}; stderr: {self._stderr[-5:]}")

    async def wait_stderr(self, pattern: re.Pattern, timeout: float) -> str:
        """The first group of the first stderr line matching `pattern`."""
        async def until() -> str:
            while True:
                for line in self._stderr:
                    if found := pattern.search(line):
                        return found.group(1)
                if self.process.returncode is not None:
                    raise RuntimeError(f"server exited: {self._stderr[-5:]}")
                self._stderr_changed.clear()
                await self._stderr_changed.wait()
        return await asyncio.wait_for(until(), timeout)

    def stderr_tail(self, lines: int) -> list[str]:
        return self._stderr[-lines:]

    async def open(self, path: Path) -> str:
        uri = path.as_uri()
        self._versions[uri] = 1
        await self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": path.read_text(encoding="utf-8")}})
        return uri

    def next_version(self, uri: str) -> int:
        self._versions[uri] = self._versions.get(uri, 1) + 1
        return self._versions[uri]

    async def shutdown(self) -> int | None:
        """`shutdown` then `exit`; the process's exit code (killed after 30 s)."""
        try:
            if self.process.returncode is None:
                await self.call("shutdown", None, 30)
                await self.notify("exit")
            return await asyncio.wait_for(self.process.wait(), 30)
        except (asyncio.TimeoutError, ConnectionError, KeyError):
            self.process.kill()
            await self.process.wait()
            return None
        finally:
            for task in self._tasks:
                task.cancel()

    async def _read_stdout(self) -> None:
        try:
            while (message := await read_message(self.process.stdout)) is not None:
                self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def _dispatch(self, message: dict) -> None:
        if "method" in message and "id" in message:  # the server asks: configuration, progress creation
            self.process.stdin.write(frame({"jsonrpc": "2.0", "id": message["id"], "result": None}))
        elif message.get("method") == "$/progress":
            value = message["params"].get("value") or {}
            if value.get("kind") == "end" and not self._ready.done():
                self._ready.set_result(value.get("message"))
        elif message.get("id") is None and "error" in message:  # a frame the server could not read
            self.unreadable_frames += 1
        elif (future := self._waiting.get(message.get("id"))) is not None and not future.done():
            future.set_result(message)

    async def _read_stderr(self) -> None:
        while line := await self.process.stderr.readline():
            self._stderr.append(line.decode("utf-8", "replace").rstrip())
            del self._stderr[:-2000]
            self._stderr_changed.set()
