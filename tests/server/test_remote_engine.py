"""`codectx ask --engine-url` against a real `mlx_lm.server` started on loopback (a tiny
random-weight model: the answers are noise, what is checked is the protocol, the prefix
the server reuses and the errors)."""
from __future__ import annotations

import subprocess
import sys

from server.exit_status import FAILED
from tests.server.remote_servers import ask, footer, free_port, prompt_and_cached, start_mlx_server


def test_a_second_ask_reuses_the_prefix_the_server_cached(mlx_server, tiny_model, tmp_path):
    _, url = mlx_server
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def double(x):\n    return 2 * x\n", encoding="utf-8")
    common = ["--engine-url", url, "--model", str(tiny_model), "--repo", str(repo), "--max-tokens", "4"]
    status, _, err = ask(*common, "What does double return?")
    assert status == 0, err
    assert prompt_and_cached(footer(err))[1] == 0
    status, _, err = ask(*common, "What does double take?")
    assert status == 0, err
    prompt, cached = prompt_and_cached(footer(err))
    assert 0 < cached < prompt  # the repository prefix came from the server's cache, the question did not


def test_an_unreachable_engine_is_a_clear_error(tiny_model, tmp_path):
    status, out, err = ask("--engine-url", f"http://127.0.0.1:{free_port()}/v1", "--model", str(tiny_model),
                           "What is this?")
    assert status == FAILED and out == ""
    assert "cannot reach the engine at http://127.0.0.1:" in err


def test_an_engine_url_that_is_not_http_is_refused(tiny_model):
    status, _, err = ask("--engine-url", "ftp://example.org/v1", "--model", str(tiny_model), "What is this?")
    assert status == FAILED and "is not an http(s) URL" in err


def test_a_server_that_comes_up_later_is_used_and_background_work_backs_off_meanwhile(tiny_model):
    from engine.loading import load_tokenizer
    from engine.request import Priority, Request
    from server.core.remote.backend import RemoteBackend
    from server.core.remote.openai_stream import Endpoint

    port = free_port()
    tokenizer, model_id, context = load_tokenizer(str(tiny_model))
    backend = RemoteBackend(Endpoint(f"http://127.0.0.1:{port}/v1"), tokenizer, model_id, "", context)
    prompt = tokenizer.encode("hello there")
    try:
        done = backend.submit(Request(prompt_ids=prompt, max_tokens=2)).result(timeout=60)
        assert done.finish_reason == "error" and "cannot reach the engine" in str(done.error)
        stats = backend.stats()
        assert stats["reachable"] is False and stats["retry_in_s"] > 0
        background = backend.submit(Request(prompt_ids=prompt, max_tokens=0, priority=Priority.BACKGROUND))
        done = background.result(timeout=60)
        assert done.finish_reason == "error" and "wait" in str(done.error)  # not sent: it backs off

        process, _ = start_mlx_server(tiny_model, port)
        try:
            done = backend.submit(Request(prompt_ids=prompt, max_tokens=2)).result(timeout=120)
            assert done.finish_reason in ("stop", "length") and done.error is None
            assert backend.stats()["reachable"] is True and backend.stats()["last_error"] is None
        finally:
            process.terminate()
            process.wait(timeout=30)
    finally:
        backend.close()


def test_http_alone_answers_on_the_remote_engine(mlx_server, tiny_model, tmp_path):
    import os

    import httpx

    from tests.polling import wait_until
    from tests.server.harness import REPO_ROOT

    _, engine_url = mlx_server

    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CODECTX_HOME=str(tmp_path / "home"))
    env.pop("CODECTX_API_KEY", None)
    process = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--log-level", "WARNING", "--http",
                                str(port), "--model", str(tiny_model), "--engine-url", engine_url],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def health():
            try:
                response = httpx.get(url + "/health", timeout=5)
            except httpx.TransportError:
                return None
            return response.json() if response.status_code == 200 else None

        wait_until(lambda: process.poll() is None and health(), timeout=120, what="codectx's HTTP server")
        body = {"model": tiny_model.name, "max_tokens": 3, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
        first = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        second = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        assert first.status_code == 200 and second.status_code == 200, first.text
        usage = second.json()["usage"]
        assert usage["prompt_tokens"] > 0 and usage["prompt_tokens_details"]["cached_tokens"] > 0
        for page in ("/monitor/state", "/metrics"):  # the status pages read the remote backend's stats
            assert httpx.get(url + page, timeout=30).status_code == 200, page
    finally:
        process.terminate()
        process.communicate(timeout=60)


def test_measure_against_a_server_that_is_not_codectx_says_so(mlx_server, tiny_model, tmp_path, capsys):
    """`codectx measure` reads codectx's own timings from the usage chunk; another OpenAI-compatible server
    (mlx_lm's here) has none: a one-line error, not a KeyError traceback."""
    from server.measure_cmd import main as measure_main

    _, url = mlx_server
    path = tmp_path / "small.py"
    path.write_text("x = 1\n", encoding="utf-8")
    status = measure_main(["--file", str(path), "--url", url.removesuffix("/v1"), "--model", str(tiny_model),
                           "--max-tokens", "2"])
    err = capsys.readouterr().err
    assert status == 1 and "is not a codectx server" in err and "Traceback" not in err
