"""A huge but valid prompt is tokenized off the event loop: /health stays fast meanwhile.

The module's server has the model's full 1M-token context as its limit, so a
400,000-character message passes the size check and really gets rendered and
tokenized (about 1.2M byte-level tokens: then refused as too long). While
that runs, a second client polls /health; if the work ran on the event loop,
the probe caught behind it would wait about as long as the whole request.
"""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.security.http_process import HttpProcess

CONTENT = "\u20ac" * 400_000  # three byte-level tokens per character in the tiny tokenizer


@pytest.fixture(scope="module")
def server(security_model, tmp_path_factory):
    running = HttpProcess.start(security_model, tmp_path_factory.mktemp("home"))
    yield running
    assert running.stop() == 0


def test_health_answers_quickly_while_a_huge_prompt_is_tokenized(server):
    outcome: dict = {}
    posted = threading.Event()

    def huge() -> None:
        body = {"model": server.model_id, "max_tokens": 1, "messages": [{"role": "user", "content": CONTENT}]}
        started = time.perf_counter()
        with httpx.Client(timeout=120) as client:
            posted.set()
            outcome["response"] = client.post(server.url + "/v1/chat/completions", json=body)
        outcome["seconds"] = time.perf_counter() - started

    worker = threading.Thread(target=huge)
    worker.start()
    posted.wait(10)
    latencies = []
    with httpx.Client(base_url=server.url, timeout=120) as probe:
        while worker.is_alive():
            started = time.perf_counter()
            assert probe.get("/health").status_code == 200
            latencies.append(time.perf_counter() - started)
    worker.join()

    response, seconds = outcome["response"], outcome["seconds"]
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "the prompt has" in error["message"]  # tokenized
    assert seconds > 0.5, f"the huge request took only {seconds:.2f} s: too fast to show anything"
    # A blocked loop answers nothing until the prompt is done (a few answers at most); a free one
    # answers hundreds, almost all at once. A single slow answer on a loaded machine is not a block.
    assert len(latencies) >= 20 and sorted(latencies)[int(0.9 * len(latencies))] < 0.1, \
        (len(latencies), sorted(latencies)[-5:], seconds)
    print(f"huge request {seconds:.2f} s; {len(latencies)} /health probes meanwhile, "
          f"max {max(latencies) * 1000:.0f} ms, median {sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms")
    server.assert_answers()
