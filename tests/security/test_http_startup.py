"""Starting the server: a port in use is one clear error; the API key comes from a file or the
environment, a world-readable key file is refused, `--api-key` is warned about, the key is never logged."""
from __future__ import annotations

import socket
import subprocess

import httpx
import pytest

from tests.security.http_process import HttpProcess, serve_command, server_env

KEY = "sk-codectx-security-5f1b2c"


def _run(*args: str, home, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(serve_command(*args), env=server_env(home, **env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture()
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("mode", [[], ["--stdio"]], ids=["http", "stdio+http"])
def test_a_port_in_use_is_one_clear_error(security_model, tmp_path, busy_port, mode):
    result = _run(*mode, "--http", f"127.0.0.1:{busy_port}", "--model", str(security_model), home=tmp_path)
    assert result.returncode == 1
    assert f"port {busy_port} on 127.0.0.1 is in use; choose another with --http" in result.stderr
    assert "Traceback" not in result.stderr
    assert "codectx HTTP API on" not in result.stderr  # nothing claims to listen
    assert result.stdout == ""


def test_the_logged_url_is_the_bound_one(security_model, tmp_path):
    server = HttpProcess.start(security_model, tmp_path)
    try:
        announced = [line for line in server.lines if "codectx HTTP API on" in line]
        assert len(announced) == 1 and server.port != 0 and f"on {server.url} " in announced[0]
        server.assert_answers()
    finally:
        assert server.stop() == 0


def test_the_key_file_is_required_and_never_logged(security_model, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    server = HttpProcess.start(security_model, tmp_path / "home", "--api-key-file", str(key_file))
    try:
        assert httpx.get(server.url + "/monitor/state", timeout=30).status_code == 401
        wrong = httpx.get(server.url + "/monitor/state", headers={"Authorization": f"Bearer {KEY[:-1]}"},
                          timeout=30)
        assert wrong.status_code == 401
        good = httpx.get(server.url + "/monitor/state", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert good.status_code == 200  # the trailing newline was stripped
        chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": server.model_id, "max_tokens": 2,
                                "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200
    finally:
        assert server.stop() == 0
    assert KEY not in server.log() and "process list" not in server.log()


@pytest.mark.parametrize("mode", [0o644, 0o606])
def test_a_key_file_other_users_can_read_is_refused(security_model, tmp_path, mode):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(mode)
    result = _run("--http", "127.0.0.1:0", "--model", str(security_model), "--api-key-file", str(key_file),
                  home=tmp_path)
    assert result.returncode == 2
    assert f"chmod 600 {key_file}" in result.stderr and "every user" in result.stderr
    assert KEY not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("content, message", [("", "is empty"), ("\n", "is empty"),
                                              (f"{KEY}\nsecond\n", "more than one line")])
def test_an_unusable_key_file_is_refused(security_model, tmp_path, content, message):
    key_file = tmp_path / "key"
    key_file.write_text(content)
    key_file.chmod(0o600)
    result = _run("--http", "127.0.0.1:0", "--model", str(security_model), "--api-key-file", str(key_file),
                  home=tmp_path)
    assert result.returncode == 2 and message in result.stderr and KEY not in result.stderr


def test_key_option_and_key_file_together_are_refused(security_model, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    result = _run("--http", "127.0.0.1:0", "--model", str(security_model), "--api-key-file", str(key_file),
                  "--api-key", KEY, home=tmp_path)
    assert result.returncode == 2 and "not both" in result.stderr and KEY not in result.stderr


def test_the_key_option_still_works_but_is_warned_about(security_model, tmp_path):
    server = HttpProcess.start(security_model, tmp_path, "--api-key", KEY)
    try:
        assert httpx.get(server.url + "/health", timeout=30).status_code == 401
        assert httpx.get(server.url + "/health", auth=("monitor", KEY), timeout=30).status_code == 200
    finally:
        assert server.stop() == 0
    log = server.log()
    assert "--api-key is visible to every user of this machine in the process list" in log
    assert KEY not in log


def test_the_key_from_the_environment_needs_no_warning(security_model, tmp_path):
    server = HttpProcess.start(security_model, tmp_path, env=server_env(tmp_path, CODECTX_API_KEY=KEY))
    try:
        assert httpx.get(server.url + "/health", timeout=30).status_code == 401
        assert httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {KEY}"},
                         timeout=30).status_code == 200
    finally:
        assert server.stop() == 0
    assert "process list" not in server.log() and KEY not in server.log()


@pytest.mark.parametrize("option, value, message", [
    ("--allow-origin", "*", "no wildcard"), ("--allow-origin", "http://localhost:3000/app", "no path"),
    ("--allow-origin", "localhost:3000", "origin such as"), ("--allow-host", "evil.example:80", "without a port"),
    ("--allow-host", "http://evil.example", "without a port")])
def test_malformed_allow_options_are_refused(security_model, tmp_path, option, value, message):
    result = _run("--http", "127.0.0.1:0", "--model", str(security_model), option, value, home=tmp_path)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
