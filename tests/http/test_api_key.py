"""Off loopback every endpoint needs the API key; the key check is constant-time and exact."""
from __future__ import annotations

import argparse
import base64

import httpx
import openai
import pytest

from server.http.auth import key_matches
from server.http.config import HttpConfig, HttpConfigError, is_loopback, parse_listen
from server.http.serve import add_arguments, config_from
from tests.http.http_harness import start_api

KEY = "sk-codectx-test-0123456789"
ENDPOINTS = [("GET", "/health"), ("GET", "/metrics"), ("GET", "/monitor"), ("GET", "/monitor/state"),
             ("GET", "/v1/models"), ("POST", "/v1/chat/completions")]


@pytest.fixture(scope="module")
def open_api(http_model, tmp_path_factory):
    """A server bound to every interface (0.0.0.0), which therefore requires `KEY`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CODECTX_HOME", str(tmp_path_factory.mktemp("home")))
        running = start_api(http_model, None, HttpConfig(host="0.0.0.0", port=0, api_key=KEY))
        yield running
        running.server.stop()
        running.source.close()


def test_listening_off_loopback_needs_a_key():
    with pytest.raises(HttpConfigError, match="API key"):
        HttpConfig(host="0.0.0.0").validate()
    HttpConfig(host="127.0.0.1").validate()
    HttpConfig(host="0.0.0.0", api_key=KEY).validate()


def test_serve_options_take_the_key_from_the_environment(monkeypatch):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.delenv("CODECTX_API_KEY", raising=False)
    with pytest.raises(HttpConfigError):
        config_from(parser.parse_args(["--http", "0.0.0.0:8000"]))
    monkeypatch.setenv("CODECTX_API_KEY", KEY)
    config = config_from(parser.parse_args(["--http", "0.0.0.0:8000"]))
    assert (config.host, config.port, config.api_key) == ("0.0.0.0", 8000, KEY)
    assert config_from(parser.parse_args(["--http", "9000"])).host == "127.0.0.1"


def test_listen_addresses():
    assert parse_listen("8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(HttpConfigError):
        parse_listen("host:http")


def test_key_matching():
    assert key_matches(f"Bearer {KEY}", KEY)
    assert key_matches("Basic " + base64.b64encode(f"me:{KEY}".encode()).decode(), KEY)
    assert not key_matches(f"Bearer {KEY}x", KEY)
    assert not key_matches(f"Bearer {KEY[:-1]}", KEY)
    assert not key_matches(f"Token {KEY}", KEY)
    assert not key_matches("Basic !!!", KEY)
    assert not key_matches(None, KEY)


@pytest.mark.parametrize("method, path", ENDPOINTS)
def test_every_endpoint_refuses_a_missing_or_wrong_key(open_api, method, path):
    for headers in ({}, {"Authorization": "Bearer wrong-key"}):
        response = httpx.request(method, open_api.url + path, headers=headers, json={}, timeout=30)
        assert response.status_code == 401, (path, headers)
        assert response.json()["error"]["type"] == "authentication_error"
        assert "Basic" in response.headers["www-authenticate"]


def test_the_right_key_is_accepted(open_api):
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(open_api.url + "/monitor", headers=headers, timeout=30).status_code == 200
    basic = httpx.get(open_api.url + "/monitor/state", auth=("monitor", KEY), timeout=30)
    assert basic.status_code == 200 and basic.json()["model"] == open_api.model_id
    client = openai.OpenAI(base_url=open_api.url + "/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model=open_api.model_id, max_tokens=2,
                                           messages=[{"role": "user", "content": "hello"}])
    assert reply.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=open_api.url + "/v1", api_key="nope", max_retries=0).models.list()
