"""Helpers for tests/http: a tiny model with a tools-aware template, a server on an ephemeral port.

The tiny model's chat template is ChatML plus a tools block and an
`enable_thinking` switch, so tests can see tools and `chat_template_kwargs`
reach the template.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pytest_lsp import ClientServerConfig

from server.http.app import create_app
from server.http.config import HttpConfig
from server.http.runner import HttpServer
from server.http.source import StandaloneSource
from server.core.settings import MemorySettings, ModelSettings, Settings
from tests.server.harness import REPO_ROOT, build_server_test_model

TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
WORKSPACE_FILES = {
    "util.py": 'def add(a, b):\n    """Returns a + b."""\n    return a + b\n',
    "main.py": "from util import add\n\n\ndef main():\n    print(add(1, 2))\n",
}
MAX_PROMPT_TOKENS = 2048
MAX_BODY_BYTES = 64 * 1024


def tiny_model_with_template(directory: Path) -> Path:
    """The end-to-end suites' tiny llama (tests/server/harness.py) with `TEMPLATE`."""
    path = build_server_test_model(directory)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE
    config_path.write_text(json.dumps(config, indent=2))
    return path


def tiny_settings() -> Settings:
    """Small prefill chunks (more checkpoints), greedy plain decoding, no disk archive."""
    return Settings(model=ModelSettings(prefill_chunk=32, speculation="off"),
                    memory=MemorySettings(archive_enabled=False))


@dataclass
class Api:
    """A started server and what tests need to reach it."""

    url: str
    source: StandaloneSource
    server: HttpServer

    @property
    def model_id(self) -> str:
        return self.source.current().model_id

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)

    def metrics(self) -> dict[str, float]:
        from server.http.prometheus import parse

        return parse(httpx.get(self.url + "/metrics", timeout=30).text)

    def state(self) -> dict:
        return httpx.get(self.url + "/monitor/state", timeout=30).json()


async def engine_ready(http: httpx.AsyncClient, timeout: float = 120) -> dict:
    """/health's answer once the language server beside the HTTP API has loaded the engine (503 until then)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            response = await http.get("/health")
            if response.status_code == 200:
                return response.json()
            assert response.status_code == 503 and response.json()["error"]["code"] == "model_loading"
        except httpx.ConnectError:
            pass
        assert asyncio.get_running_loop().time() < deadline, "the engine did not load in time"
        await asyncio.sleep(0.05)  # a poll interval, not a wait for an event


def start_api(model: Path, workspace: Path | None, config: HttpConfig) -> Api:
    source = StandaloneSource.start(str(model), workspace=workspace, settings=tiny_settings())
    server = HttpServer(create_app(source, config), config.host, config.port)
    server.start()
    return Api(server.url, source, server)


def free_port() -> int:
    """A loopback port free right now (the server binds it moments later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stdio_http_config(port: int) -> ClientServerConfig:
    """pytest-lsp's config for `codectx serve --stdio --http 127.0.0.1:PORT` (no API key)."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT),
               CODECTX_HOME=os.environ.get("CODECTX_HOME", "/tmp/codectx-test-home"))
    env.pop("CODECTX_API_KEY", None)
    return ClientServerConfig(server_command=[sys.executable, "-m", "server.serve_cmd", "--log-level", "WARNING",
                                              "--stdio", "--http", f"127.0.0.1:{port}"], server_env=env)
