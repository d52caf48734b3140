"""Slow and silent clients are cut off after a bounded time (raw sockets against the real process).

The module's server runs with ``--idle-timeout 1 --request-timeout 2``. A
slowloris client is paced by the server itself: it sends the next byte each
time the server has stayed silent for `PACE_S`, and stops when the server
answers or closes.
"""
from __future__ import annotations

import socket
import time

import pytest

from tests.security.http_process import HttpProcess, raw_exchange, read_until_closed, status_and_json

IDLE_S, REQUEST_S = 1.0, 2.0
PACE_S = 0.2
SLACK_S = 2.0  # scheduling on two busy cores


@pytest.fixture(scope="module")
def server(security_model, tmp_path_factory):
    running = HttpProcess.start(security_model, tmp_path_factory.mktemp("home"), "--idle-timeout", str(IDLE_S),
                                "--request-timeout", str(REQUEST_S))
    yield running
    assert running.stop() == 0


def _connect(server: HttpProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _trickle(sock: socket.socket, data: bytes) -> tuple[bytes, int]:
    """Send `data` one byte per `PACE_S` of server silence; (what the server sent, bytes sent)."""
    sock.settimeout(PACE_S)
    for sent, byte in enumerate(data):
        try:
            reply = sock.recv(65536)
        except socket.timeout:
            sock.sendall(bytes([byte]))
            continue
        except ConnectionResetError:
            return b"", sent
        return reply + read_until_closed(sock, 10), sent
    return read_until_closed(sock, 10), len(data)


def test_a_silent_connection_is_closed_after_the_idle_timeout(server):
    started = time.monotonic()
    with _connect(server) as sock:
        assert read_until_closed(sock, IDLE_S + 10) == b""  # closed without a word
    elapsed = time.monotonic() - started
    assert IDLE_S * 0.9 <= elapsed <= IDLE_S + SLACK_S
    server.assert_answers()


def test_headers_sent_byte_by_byte_get_408_within_the_request_timeout(server):
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"a" * 200 + b"\r\n\r\n"
    started = time.monotonic()
    with _connect(server) as sock:
        reply, sent = _trickle(sock, request)
    elapsed = time.monotonic() - started
    assert sent < len(request)  # cut off before the headers were complete
    status, body = status_and_json(reply)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert REQUEST_S * 0.9 <= elapsed <= REQUEST_S + SLACK_S
    server.assert_answers()


def test_a_body_sent_byte_by_byte_is_cut_off(server):
    body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 200 + b'"}]}'
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    started = time.monotonic()
    with _connect(server) as sock:
        sock.sendall(head)
        reply, sent = _trickle(sock, body)
    elapsed = time.monotonic() - started
    assert sent < len(body)
    assert reply == b"" or status_and_json(reply)[0] == 408
    assert REQUEST_S * 0.9 <= elapsed <= REQUEST_S + SLACK_S
    server.assert_answers()


def test_a_keep_alive_connection_that_goes_quiet_is_closed(server):
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(10)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        rest = read_until_closed(sock, IDLE_S + 10)
    assert b"HTTP/1.1" not in rest  # nothing more was sent, only the close
    assert time.monotonic() - started <= IDLE_S + SLACK_S
    server.assert_answers()


def test_timeouts_are_logged_without_flooding(server):
    sockets = [_connect(server) for _ in range(6)]
    try:
        for sock in sockets:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        replies = [read_until_closed(sock, REQUEST_S + 10) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    assert all(status_and_json(reply)[0] == 408 for reply in replies)
    warnings = [line for line in server.lines if "took over" in line]
    assert 1 <= len(warnings) <= 2, warnings  # at most one per 10 s, for 8 timeouts in this module
    server.assert_answers()


def test_malformed_requests_get_json_400s_and_a_short_log(server):
    garbage = [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello
               b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n",
               b"GET /health HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
               b"GET /health HTTP/1.1\r\n\r\n"]  # no Host
    for _ in range(10):
        for raw in garbage:
            status, body = status_and_json(raw_exchange(server.port, raw))
            assert status == 400 and body["error"]["code"] == "invalid_http"
    warnings = [line for line in server.lines if "Invalid HTTP request" in line]
    assert 1 <= len(warnings) <= 2, warnings  # 40 malformed requests, at most one line per 10 s
    server.assert_answers()
