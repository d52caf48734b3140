"""The loop guard and the repetition penalty through the server: the `generation.*` settings, the
core's ask (settings changed while it runs), `codectx ask`'s footer, the HTTP API's finish reason and
a remote engine's answer (`mlx_lm.server`), on a tiny random model that loops under greedy decoding."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from engine.loop_guard import LoopRule
from server.ask_cmd import LOOP_NOTE
from server.core.features import ask as ask_feature
from server.core.settings import GenerationSettings, parse_settings
from server.http.config import HttpConfig
from tests.engine.tiny_models import build_tiny_model
from tests.http.http_harness import start_api
from tests.server.remote_servers import ask, footer, start_mlx_server
from tests.server.harness import default_options, loaded_host, write_sample_workspace
from tests.server.test_cli import codectx

ANSWER_TOKENS = 96


@pytest.fixture(scope="module")
def looping_model(tmp_path_factory) -> Path:
    """The end-to-end suites' tiny llama shape at weight scale 1.0: greedy output loops."""
    return build_tiny_model(tmp_path_factory.mktemp("looping-model"), weight_scale=1.0, hidden_size=64,
                            num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
                            num_key_value_heads=1)


def test_generation_settings_parse_and_refuse_bad_values():
    settings, problems = parse_settings({"generation": {"loopGuard": False, "repetitionPenalty": 1.25}})
    assert problems == [] and settings.generation == GenerationSettings(loop_guard=False, repetition_penalty=1.25)
    settings, problems = parse_settings({"generation": {"repetitionPenalty": 2}})
    assert problems == [] and settings.generation.repetition_penalty == 2.0
    for bad in (0.5, "1.2", True, None, float("nan")):
        settings, problems = parse_settings({"generation": {"repetitionPenalty": bad, "loopGuard": "yes"}})
        assert settings.generation == GenerationSettings()
        assert len(problems) == 2 and problems[0].startswith("generation.repetitionPenalty: "), problems


async def test_the_core_ask_stops_a_loop_and_settings_switch_it_at_once(looping_model, tmp_path):
    workspace = write_sample_workspace(tmp_path)
    options = default_options(looping_model)
    host = await loaded_host(options, workspace)
    session = host.ready_now()

    async def answer() -> tuple[ask_feature.AskResult, str]:
        streamed: list[str] = []
        result = await ask_feature.ask(session, "What does add do?", on_text=streamed.append,
                                       max_tokens=ANSWER_TOKENS)
        return result, "".join(streamed)

    try:
        guarded, streamed = await answer()
        assert guarded.finish_reason == "repetition" and guarded.text == streamed
        assert guarded.metrics["decode_tokens"] < ANSWER_TOKENS and guarded.metrics["loop_tokens"] >= LoopRule().min_tokens
        assert guarded.as_dict()["finishReason"] == "repetition"

        host.apply_settings(parse_settings({**options, "generation": {"loopGuard": False}})[0])
        free, _ = await answer()
        assert free.finish_reason == "length" and free.metrics["decode_tokens"] == ANSWER_TOKENS
        assert free.text.startswith(guarded.text) and free.metrics["loop_period"] == 0

        # This model's loop token leads the next one by a wide margin: a strong penalty moves it.
        host.apply_settings(parse_settings({**options, "generation": {"loopGuard": False,
                                                                      "repetitionPenalty": 8.0}})[0])
        penalized, _ = await answer()
        assert penalized.finish_reason == "length" and penalized.text != free.text

        host.apply_settings(parse_settings(options)[0])  # back to the defaults: the same answer as first
        again, _ = await answer()
        assert (again.text, again.finish_reason) == (guarded.text, "repetition")
    finally:
        host.close()


def test_codectx_ask_footer_says_repetition(looping_model):
    question = ("ask", "--model", str(looping_model), "--max-tokens", str(ANSWER_TOKENS), "What does add do?")
    guarded = codectx(*question)
    assert guarded.returncode == 0, guarded.stderr
    *_, note, footer = guarded.stderr.strip().splitlines()
    assert footer.endswith("| repetition]") and f"decode {ANSWER_TOKENS} tok" not in footer, footer
    assert note == LOOP_NOTE
    free = codectx(*question, "--no-loop-guard")
    assert free.returncode == 0, free.stderr
    free_footer = free.stderr.strip().splitlines()[-1]
    assert free_footer.endswith("| length]") and f"decode {ANSWER_TOKENS} tok" in free_footer, free_footer
    assert LOOP_NOTE not in free.stderr
    assert free.stdout.startswith(guarded.stdout.rstrip("\n"))
    refused = codectx(*question, "--repetition-penalty", "0.5")
    assert refused.returncode == 2 and "--repetition-penalty" in refused.stderr


def test_http_sends_stop_with_the_engine_reason_in_codectx(looping_model, tmp_path, monkeypatch):
    monkeypatch.setenv("CODECTX_HOME", str(tmp_path / "home"))
    api = start_api(looping_model, None, HttpConfig(port=0))
    try:
        with httpx.Client(base_url=api.url, timeout=60) as client:
            body = {"model": api.model_id, "max_tokens": ANSWER_TOKENS,
                    "messages": [{"role": "user", "content": "What does add do?"}]}
            reply = client.post("/v1/chat/completions", json=body).json()
            assert reply["choices"][0]["finish_reason"] == "stop"
            assert reply["codectx"]["finish_reason"] == "repetition" and reply["codectx"]["loop_tokens"] >= LoopRule().min_tokens
            assert reply["usage"]["completion_tokens"] < ANSWER_TOKENS

            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
                events = [line[len("data: "):] for line in stream.iter_lines() if line.startswith("data: ")]
            chunks = [json.loads(e) for e in events if e != "[DONE]"]
            closing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            assert len(closing) == 1 and closing[0]["choices"][0]["finish_reason"] == "stop"
            assert closing[0]["codectx"] == {"finish_reason": "repetition"}
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            assert text == reply["choices"][0]["message"]["content"] and events[-1] == "[DONE]"

            short = client.post("/v1/chat/completions", json={**body, "max_tokens": 4}).json()
            assert short["choices"][0]["finish_reason"] == "length"
            assert short["codectx"]["finish_reason"] == "length"
    finally:
        api.server.stop()
        api.source.close()


def test_a_remote_engines_loop_is_stopped_and_its_stream_closed(looping_model):
    """`mlx_lm.server` (started here, on loopback) serves the looping model: the guard reads its streamed
    text and closes the stream before the limit, and the server answers the next request the same;
    `--no-loop-guard` lets the same answer run to the limit."""
    process, url = start_mlx_server(looping_model)
    question = ("--engine-url", url, "--model", str(looping_model), "--max-tokens", str(ANSWER_TOKENS),
                "What does add do?")
    try:
        status, guarded, err = ask(*question)
        assert status == 0, err
        assert footer(err).endswith("| repetition]") and f"decode {ANSWER_TOKENS} tok" not in footer(err), err
        status, free, err = ask(*question, "--no-loop-guard")
        assert status == 0, err
        assert footer(err).endswith("| length]"), err
        assert free.startswith(guarded.rstrip("\n")) and len(free) > len(guarded)
        status, again, err = ask(*question)  # the server still answers after a closed stream
        assert status == 0 and again == guarded and footer(err).endswith("| repetition]"), err
    finally:
        process.kill()
        process.wait(timeout=30)
