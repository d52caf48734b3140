"""A client that goes away cancels its engine request, which rolls back to confirmed state."""
from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

from tests.polling import wait_until

LONG = 3000  # far more than the test lets it decode: only a cancel ends it early
MESSAGES = [{"role": "system", "content": "Disconnect test."}, {"role": "user", "content": "Talk for a long time."}]


def _recent(api, request_id: str) -> dict | None:
    return next((r for r in api.state()["recent"] if r["id"] == request_id), None)


def _decoding(api) -> dict | None:
    return next((r for r in api.state()["active"] if r["phase"] == "decode" and r["decode_tokens"] > 0), None)


def _engine_idle(api) -> None:
    """The workspace warm-up (background, queued at start) is done, so the live cache is ours alone."""
    wait_until(lambda: api.metrics()["codectx_engine_queued_requests"] == 0, what="the warm-up to finish")


def _greedy_answer(api) -> str:
    with api.client() as http:
        body = {"model": api.model_id, "messages": MESSAGES, "max_tokens": 16}
        return http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]


def _assert_cancelled_and_rolled_back(api, request_id: str, cancelled_before: float) -> None:
    row = wait_until(lambda: _recent(api, request_id), what="the cancelled request to finish")
    assert row["finish_reason"] == "cancelled"
    assert 0 < row["decode_tokens"] < LONG
    metrics = api.metrics()
    assert metrics['codectx_engine_requests_total{outcome="cancelled"}'] == cancelled_before + 1
    # Rolled back to confirmed state: the prompt plus the answer's periodic checkpoints
    # (every prefill_chunk tokens), never the unconfirmed tail of the decoded tokens.
    interval = api.source.current().backend.stats()["prefill_chunk"]
    kept_answer = metrics["codectx_live_tokens"] - row["prompt_tokens"]
    assert 0 <= kept_answer <= row["decode_tokens"] and kept_answer % interval == 0


def test_closing_a_stream_cancels_generation(api):
    _engine_idle(api)
    expected = _greedy_answer(api)
    before = api.metrics()['codectx_engine_requests_total{outcome="cancelled"}']
    body = {"model": api.model_id, "messages": MESSAGES, "max_tokens": LONG, "stream": True}
    with api.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            chunk = json.loads(line[len("data: "):]) if line.startswith("data: {") else None
            if chunk and chunk["choices"][0]["delta"].get("content"):
                request_id = chunk["id"]
                break
    _assert_cancelled_and_rolled_back(api, request_id, before)
    assert _greedy_answer(api) == expected  # the cache is consistent after the rollback


def test_dropping_a_non_streaming_request_cancels_generation(api):
    _engine_idle(api)
    before = api.metrics()['codectx_engine_requests_total{outcome="cancelled"}']
    url = urlparse(api.url)
    body = json.dumps({"model": api.model_id, "messages": MESSAGES, "max_tokens": LONG}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(head + body)
        running = wait_until(lambda: _decoding(api), what="the request to start decoding")
    _assert_cancelled_and_rolled_back(api, running["id"], before)
