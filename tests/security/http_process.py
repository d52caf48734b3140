"""The real `codectx serve --http` process for the HTTP security tests.

`HttpProcess.start` runs ``python -m server.serve_cmd --http 127.0.0.1:0 ...``
with CODECTX_HOME in a temporary directory, drains its stderr on a thread and
waits for the line the server logs once its socket serves, which carries the
port it really got. The model is the end-to-end suites' tiny llama with the
tools-aware template of tests/http, given a 1M-token context so that a
multi-megabyte prompt is "valid" and really gets tokenized.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.engine.tiny_models import build_tiny_model
from tests.http.http_harness import TEMPLATE, WORKSPACE_FILES
from tests.server.harness import REPO_ROOT

LISTENING = re.compile(r"codectx HTTP API on (http://\S+) ")
BIG_CONTEXT = 1 << 20


def build_model(directory: Path) -> Path:
    """The tiny test llama (tests/server/harness.py sizes) with `TEMPLATE` and a 1M-token context."""
    path = build_tiny_model(directory, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=BIG_CONTEXT)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    return path


def write_workspace(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in WORKSPACE_FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def server_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CODECTX_HOME=str(home), **extra)
    if "CODECTX_API_KEY" not in extra:
        env.pop("CODECTX_API_KEY", None)
    return env


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "server.serve_cmd", *args]


@dataclass
class HttpProcess:
    """A running server process and what the tests read from it."""

    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    url: str = ""
    model_id: str = ""
    _listening: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, model: Path, home: Path, *args: str, workspace: Path | None = None,
              env: dict[str, str] | None = None, timeout: float = 120.0) -> HttpProcess:
        """Start ``serve_cmd --http 127.0.0.1:0 --model MODEL [args]`` and wait until it serves."""
        command = serve_command("--http", "127.0.0.1:0", "--model", str(model), *args)
        if workspace is not None:
            command += ["--workspace", str(workspace)]
        process = subprocess.Popen(command, env=env or server_env(home), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        running = cls(process)
        threading.Thread(target=running._drain, daemon=True).start()
        if not running._listening.wait(timeout):
            running.stop()
            raise AssertionError("the server did not log its URL:\n" + "".join(running.lines[-30:]))
        if not running.url:
            raise AssertionError(f"the server exited ({process.poll()}):\n" + "".join(running.lines[-30:]))
        running.model_id = model.name  # the id a model directory is served under
        return running

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            match = LISTENING.search(line)
            if match and not self.url:
                self.url = match.group(1)
                self._listening.set()
        self._listening.set()  # exited: start() reports it

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def open_fds(self) -> int:
        """File descriptors the server process holds now."""
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def log(self) -> str:
        return "".join(self.lines)

    def metrics(self) -> dict[str, float]:
        """/metrics parsed: sample (with labels) -> value."""
        from server.http.prometheus import parse

        return parse(httpx.get(self.url + "/metrics", timeout=30).text)

    def health(self, timeout: float = 30.0) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=timeout)

    def chat(self, content: str = "hello", **extra: Any) -> httpx.Response:
        """A short completion on the plain model (2 tokens)."""
        body = {"model": self.model_id, "max_tokens": 2, "messages": [{"role": "user", "content": content}], **extra}
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=60)

    def assert_answers(self) -> None:
        """The server still serves a normal client: /health and a short completion."""
        assert self.process.poll() is None, "the server died:\n" + self.log()[-3000:]
        assert self.health().json()["status"] == "ok"
        reply = self.chat()
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1

    def stop(self) -> int:
        """SIGTERM, then wait; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_until_closed(sock, timeout)


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def status_and_json(raw: bytes) -> tuple[int, dict]:
    """(status, JSON body) of a raw HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


