"""The remote backend against llama.cpp's own `llama-server` (built by scripts/dev-setup.sh from the
llama-cpp-python sdist) on the default model's GGUF, on loopback: `codectx ask --engine-url` reuses
the server's cached prefix, and a server killed mid-stream ends the request with a clear error."""
from __future__ import annotations

import time

from engine.loading import load_tokenizer
from engine.request import Request, SamplingParams
from server.core.remote.backend import RemoteBackend
from server.core.remote.openai_stream import Endpoint
from server.core.remote.start import tokenizer_check
from tests.server.remote_servers import ask, footer, prompt_and_cached


def test_a_second_ask_restores_the_repository_prefix_on_the_server(llama, default_model_path, tmp_path):
    _, url = llama
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text('def double(x):\n    """Twice x."""\n    return 2 * x\n', encoding="utf-8")
    common = ["--engine-url", url, "--model", str(default_model_path), "--repo", str(repo), "--max-tokens", "16"]
    status, out, err = ask(*common, "What does double() return?")
    assert status == 0 and out.strip(), err
    assert prompt_and_cached(footer(err))[1] == 0  # a fresh server holds nothing
    status, out, err = ask(*common, "What does double() take?")
    assert status == 0 and out.strip(), err
    prompt, cached = prompt_and_cached(footer(err))
    assert prompt > cached > prompt - 20  # all but the new question's few tokens came from the server's cache


def test_the_local_tokenizer_is_checked_against_the_servers(llama, default_model_path, tiny_model):
    _, url = llama
    assert tokenizer_check(Endpoint(url), load_tokenizer(str(default_model_path))[0]) == "matches"
    assert tokenizer_check(Endpoint(url), load_tokenizer(str(tiny_model))[0]).startswith("differs: ")


def test_a_server_killed_mid_stream_ends_the_request_with_a_clear_error(llama, default_model_path):
    process, url = llama
    tokenizer, model_id, context = load_tokenizer(str(default_model_path))
    backend = RemoteBackend(Endpoint(url), tokenizer, model_id, "", context)
    try:
        handle = backend.submit(Request(prompt_ids=tokenizer.encode("Count from one to five hundred: one, two,"),
                                        max_tokens=2000, sampling=SamplingParams(temperature=0.0)))
        for _ in handle:  # the first streamed text: the server is generating
            process.kill()
            break
        done = handle.result(timeout=60)
        assert done.finish_reason == "error"
        assert "stream" in str(done.error) and isinstance(done.error, Exception)
    finally:
        backend.close()


def test_cancel_closes_the_stream_and_the_server_stops_generating(llama, default_model_path):
    _, url = llama
    tokenizer, model_id, context = load_tokenizer(str(default_model_path))
    backend = RemoteBackend(Endpoint(url), tokenizer, model_id, "", context)
    endpoint = Endpoint(url.removesuffix("/v1"))
    try:
        handle = backend.submit(Request(prompt_ids=tokenizer.encode("Count from one to five hundred: one, two,"),
                                        max_tokens=4000, sampling=SamplingParams(temperature=0.0)))
        queued = backend.submit(Request(prompt_ids=tokenizer.encode("Say yes."), max_tokens=4))
        for _ in handle:  # the server is generating (4,000 tokens would take it tens of seconds)
            assert any(slot["is_processing"] for slot in endpoint.get_json("slots"))
            queued.cancel()
            queued.cancel()  # a session's cancel-all, then the awaiting task's own: one cancellation
            assert backend.stats()["requests_cancelled"] == 1  # counted at the cancel: a status read next agrees
            handle.cancel()
            assert backend.stats()["requests_cancelled"] == 2  # before the worker has left the stream
            break
        done = handle.result(timeout=30)
        assert done.finish_reason == "cancelled" and done.metrics.decode_tokens < 4000
        assert queued.result(timeout=30).finish_reason == "cancelled"
        assert backend.stats()["requests_cancelled"] == 2 and backend.stats()["requests_served"] == 0
        deadline = time.monotonic() + 20  # the server notices the closed connection at its next write
        while any(slot["is_processing"] for slot in endpoint.get_json("slots")):
            assert time.monotonic() < deadline, "the server kept generating after the stream was closed"
            time.sleep(0.1)
    finally:
        backend.close()
