"""A connection flood gets clear 503s, file descriptors stay bounded and the log is not flooded.

The module's server runs with ``--max-connections 8`` and a long idle
timeout, so connections the test holds open stay open while it floods.
"""
from __future__ import annotations

import socket

import pytest

from tests.polling import wait_until
from tests.security.http_process import HttpProcess, read_until_closed, status_and_json

CAP = 8
FLOOD = 200


@pytest.fixture(scope="module")
def server(security_model, tmp_path_factory):
    running = HttpProcess.start(security_model, tmp_path_factory.mktemp("home"), "--max-connections", str(CAP),
                                "--idle-timeout", "30")
    yield running
    assert running.stop() == 0


def _settled(server: HttpProcess, baseline: int) -> None:
    wait_until(lambda: server.open_fds() <= baseline, 10, "the server to close earlier connections")


def _open(server: HttpProcess, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(count)]


def test_connections_over_the_cap_get_503_and_are_closed(server):
    baseline = server.open_fds()
    held = _open(server, CAP)
    extra = _open(server, 3)
    try:
        replies = [read_until_closed(sock, 10) for sock in extra]
        for reply in replies:
            status, body = status_and_json(reply)
            assert status == 503 and body["error"]["code"] == "too_many_connections"
            assert b"retry-after: 1" in reply.lower()
        for sock in held:  # served connections are not touched
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
        refused = server.health(timeout=10)  # a normal client while the cap is reached
        assert refused.status_code == 503
    finally:
        for sock in held + extra:
            sock.close()
    _settled(server, baseline)
    server.assert_answers()


def test_a_flood_keeps_file_descriptors_bounded_and_the_log_short(server):
    baseline = server.open_fds()
    peak = baseline
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            if len(flood) % 20 == 0:
                peak = max(peak, server.open_fds())
        peak = max(peak, server.open_fds())
        outcomes = [read_until_closed(sock, 10) for sock in flood[CAP:]]
    finally:
        for sock in flood:
            sock.close()
    # The cap's connections, as many refused ones lingering for their 503, and the few accept
    # batches (of CAP each) that asyncio has taken from the kernel queue but not yet closed.
    assert peak <= baseline + 6 * CAP, (baseline, peak)
    assert all(o == b"" or status_and_json(o)[0] == 503 for o in outcomes)  # answered or reset, none hangs
    assert sum(1 for o in outcomes if o) >= CAP  # at least the first refused ones read their 503
    warnings = [line for line in server.lines if "refused a connection" in line]
    assert 1 <= len(warnings) <= 3, warnings
    _settled(server, baseline)
    server.assert_answers()
