"""The language server's log: INFO goes to the client as window/logMessage, stderr keeps only
warnings and errors (editors show a server's stderr as errors) unless asked for more.

Driven over real LSP framing on the `codectx serve` process's stdin and stdout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.server.harness import REPO_ROOT, default_options, write_sample_workspace

STARTED = "engine started on"
TIMEOUT_S = 60


def _frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _read(stdout) -> dict:
    length = None
    while (line := stdout.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    assert length is not None, "the server closed stdout"
    return json.loads(stdout.read(length))


def _session(tiny_model: Path, root: Path, home: Path, *args: str) -> tuple[list[dict], dict, str, int]:
    """initialize, initialized, wait for the engine's start-up log line, shutdown, exit.

    Returns:
        (window/logMessage params, the shutdown response, stderr, exit status).
    """
    env = dict(os.environ, CODECTX_HOME=str(home))
    env.pop("CODECTX_STDERR_LEVEL", None)
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", *args], cwd=REPO_ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    logs: list[dict] = []
    watchdog = threading.Timer(TIMEOUT_S, proc.kill)  # a server that never sends it fails, not hangs
    watchdog.start()
    try:
        proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "processId": None, "rootUri": root.as_uri(), "capabilities": {},
            "initializationOptions": default_options(tiny_model)}}))
        proc.stdin.write(_frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        proc.stdin.flush()
        while not any(STARTED in m["message"] for m in logs):
            message = _read(proc.stdout)
            if message.get("method") == "window/logMessage":
                logs.append(message["params"])
        proc.stdin.write(_frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
        proc.stdin.flush()
        while (reply := _read(proc.stdout)).get("id") != 2:
            pass
        proc.stdin.write(_frame({"jsonrpc": "2.0", "method": "exit"}))
        proc.stdin.close()
        stderr = proc.stderr.read().decode()
        return logs, reply, stderr, proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()


@pytest.fixture()
def root(tmp_path) -> Path:
    (tmp_path / "ws").mkdir()
    return write_sample_workspace(tmp_path / "ws")


def test_start_up_logs_to_the_client_not_to_stderr(tiny_model, root, tmp_path):
    logs, reply, stderr, status = _session(tiny_model, root, tmp_path / "home")
    started = [m for m in logs if STARTED in m["message"]]
    assert started and started[0]["type"] == 3  # MessageType.Info
    assert all(m["message"].startswith(("INFO ", "WARNING ", "ERROR ", "DEBUG ")) for m in logs)
    assert " INFO " not in stderr and STARTED not in stderr, stderr
    assert reply == {"jsonrpc": "2.0", "id": 2, "result": None} and status == 0


def test_stderr_level_writes_more_to_stderr(tiny_model, root, tmp_path):
    logs, reply, stderr, status = _session(tiny_model, root, tmp_path / "home", "--stderr-level", "INFO")
    assert any(STARTED in m["message"] for m in logs)
    assert any(" INFO " in line and STARTED in line for line in stderr.splitlines()), stderr
    assert reply["result"] is None and status == 0
