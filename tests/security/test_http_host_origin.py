"""Web pages cannot use the loopback API: Host allowlist (DNS rebinding), Origin, CORS, JSON-only bodies.

One real `serve --http` process for the module, started with one extra host
name and one allowed origin. Each test sends what a browser would send in the
attack (or in the legitimate case) and checks the outcome, then that the
server still answers a normal client.
"""
from __future__ import annotations

import json

import httpx
import pytest

from tests.security.http_process import HttpProcess, raw_exchange, status_and_json

ALLOWED_HOST = "codectx.internal"
ALLOWED_ORIGIN = "http://localhost:3000"


@pytest.fixture(scope="module")
def server(security_model, security_workspace, tmp_path_factory):
    running = HttpProcess.start(security_model, tmp_path_factory.mktemp("home"), "--allow-host", ALLOWED_HOST,
                                "--allow-origin", ALLOWED_ORIGIN, workspace=security_workspace)
    yield running
    assert running.stop() == 0


def _chat_body(server: HttpProcess) -> dict:
    return {"model": server.model_id, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Print the secret in util.py"}]}


def _error(response: httpx.Response) -> dict:
    return response.json()["error"]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "127.0.0.1.nip.io", "localhost.evil.example"])
def test_a_foreign_host_name_is_refused(server, host):
    """DNS rebinding: the browser sends the attacker's name as Host."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        state = client.get("/monitor/state", headers={"Host": host})
        chat = client.post("/v1/chat/completions", json=_chat_body(server), headers={"Host": host})
    for response in (state, chat):
        assert response.status_code == 403
        error = _error(response)
        assert error["code"] == "host_not_allowed" and "--allow-host" in error["message"]
    server.assert_answers()


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "127.0.0.1:9", "[::1]:8765", "[::1]", ALLOWED_HOST,
                                  f"{ALLOWED_HOST}:443"])
def test_loopback_names_and_allowed_names_are_served(server, host):
    response = httpx.get(server.url + "/health", headers={"Host": host}, timeout=30)
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_missing_host_header_is_a_400(server):
    http11 = raw_exchange(server.port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    http10 = raw_exchange(server.port, b"GET /health HTTP/1.0\r\n\r\n")
    status, body = status_and_json(http11)
    assert status == 400 and body["error"]["code"] == "invalid_http" and "Host" in body["error"]["message"]
    status, body = status_and_json(http10)
    assert status == 400 and body["error"]["code"] == "missing_host"
    server.assert_answers()


def test_a_cross_origin_text_plain_post_is_refused(server):
    """The reviewer's attack: a page POSTs text/plain (no preflight) to the chat endpoint."""
    before = httpx.get(server.url + "/monitor/state", timeout=30).json()["totals"]
    response = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(_chat_body(server)),
                          headers={"Content-Type": "text/plain", "Origin": "http://evil.example",
                                   "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}, timeout=30)
    assert response.status_code == 403 and _error(response)["code"] == "origin_not_allowed"
    assert "--allow-origin http://evil.example" in _error(response)["message"]
    assert "access-control-allow-origin" not in response.headers
    after = httpx.get(server.url + "/monitor/state", timeout=30).json()["totals"]
    assert after["requests"] == before["requests"]  # nothing reached the engine
    server.assert_answers()


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:3001", "https://localhost:3000",
                                    "http://127.0.0.1"])
def test_foreign_origins_cannot_read_the_monitor_state(server, origin):
    response = httpx.get(server.url + "/monitor/state", headers={"Origin": origin}, timeout=30)
    assert response.status_code == 403 and _error(response)["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in response.headers


def test_same_origin_requests_are_served(server):
    """The /monitor page polls /monitor/state from its own origin; a same-origin POST works too."""
    headers = {"Origin": server.url, "Sec-Fetch-Site": "same-origin"}
    state = httpx.get(server.url + "/monitor/state", headers=headers, timeout=30)
    assert state.status_code == 200 and state.json()["model"] == server.model_id
    as_localhost = server.url.replace("127.0.0.1", "localhost")
    chat = httpx.post(server.url + "/v1/chat/completions", json=_chat_body(server), timeout=60,
                      headers={"Origin": as_localhost, "Host": as_localhost.split("//")[1]})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] >= 1


def test_sec_fetch_site_cross_site_without_origin_is_refused_except_navigation(server):
    fetch = httpx.get(server.url + "/monitor/state", timeout=30,
                      headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"})
    same_site = httpx.get(server.url + "/metrics", timeout=30,
                          headers={"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"})
    link = httpx.get(server.url + "/monitor", timeout=30,
                     headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"})
    typed = httpx.get(server.url + "/monitor", timeout=30, headers={"Sec-Fetch-Site": "none"})
    assert fetch.status_code == 403 and same_site.status_code == 403
    assert link.status_code == 200 and typed.status_code == 200 and "<html" in link.text.lower()


def test_preflight_from_a_foreign_origin_gets_no_cors_allowance(server):
    response = httpx.options(server.url + "/v1/chat/completions", timeout=30, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert response.status_code == 403
    assert not any(name.startswith("access-control-") for name in response.headers)
    server.assert_answers()


def test_an_allowed_origin_gets_cors_headers_and_its_preflight(server):
    preflight = httpx.options(server.url + "/v1/chat/completions", timeout=30, headers={
        "Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    chat = httpx.post(server.url + "/v1/chat/completions", json=_chat_body(server), timeout=60,
                      headers={"Origin": ALLOWED_ORIGIN, "Sec-Fetch-Site": "same-site"})
    assert chat.status_code == 200 and chat.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "Origin" in chat.headers["vary"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx", "json"])
def test_post_bodies_must_be_declared_json(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(_chat_body(server)),
                          headers=headers, timeout=30)
    assert response.status_code == 415 and _error(response)["code"] == "unsupported_media_type"
    if content_type is None:
        assert "got none" in _error(response)["message"]


def test_json_with_parameters_is_accepted(server):
    response = httpx.post(server.url + "/v1/chat/completions", content=json.dumps(_chat_body(server)),
                          headers={"Content-Type": "Application/JSON; charset=utf-8"}, timeout=60)
    assert response.status_code == 200


def test_unknown_paths_and_methods_get_openai_errors(server):
    missing = httpx.get(server.url + "/v1/nothing", timeout=30)
    wrong = httpx.delete(server.url + "/v1/chat/completions", timeout=30)
    assert missing.status_code == 404 and _error(missing)["code"] == "not_found"
    assert wrong.status_code == 405 and _error(wrong)["code"] == "method_not_allowed"
