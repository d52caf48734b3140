"""`codectx serve --http` as a process: HTTP alone starts, answers and stops on SIGTERM."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx

from tests.polling import wait_until
from tests.server.harness import REPO_ROOT
from tests.http.http_harness import free_port


def _serve(*args: str, home) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CODECTX_HOME=str(home))
    env.pop("CODECTX_API_KEY", None)
    return subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--log-level", "WARNING", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _health(url: str) -> dict | None:
    try:
        response = httpx.get(url + "/health", timeout=5)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


def test_http_alone_serves_the_workspace_and_stops_on_sigterm(http_model, http_workspace, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = _serve("--http", str(port), "--model", str(http_model), "--workspace", str(http_workspace),
                     home=tmp_path)
    try:
        health = wait_until(lambda: process.poll() is None and _health(url), timeout=120, what="the server")
        assert health["model"] == http_model.name and health["repository"] is True
        reply = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "codectx", "max_tokens": 3, "messages": [{"role": "user", "content": "What is in util.py?"}]})
        assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] > 0
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    assert out == ""  # nothing on stdout: logs go to stderr


def test_off_loopback_without_a_key_refuses_to_start(tmp_path):
    process = _serve("--http", f"0.0.0.0:{free_port()}", "--model", "unused", home=tmp_path)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "API key" in err


def test_http_does_not_combine_with_tcp():
    import argparse

    from server.http.serve import run
    from server.serve_cmd import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["--http", "8000", "--tcp", "9000"])) == 2
