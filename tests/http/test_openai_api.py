"""The OpenAI-compatible API over real HTTP: the `openai` client library and raw httpx."""
from __future__ import annotations

import json

import openai
import pytest

from server.http.chat_prompt import REPOSITORY_MODEL

from tests.http.http_harness import MAX_BODY_BYTES, MAX_PROMPT_TOKENS

SYSTEM = "You are a terse assistant for a small Python project. " * 8


@pytest.fixture()
def client(api) -> openai.OpenAI:
    return openai.OpenAI(base_url=api.url + "/v1", api_key="unused-on-loopback", max_retries=0)


def test_models_lists_the_loaded_model_and_the_repository(client, api):
    ids = [m.id for m in client.models.list().data]
    assert ids == [api.model_id, REPOSITORY_MODEL]


def test_health(api):
    with api.client() as http:
        body = http.get("/health").json()
    assert body["status"] == "ok" and body["model"] == api.model_id and body["repository"] is True


def test_non_streaming_answer_with_usage(client, api):
    reply = client.chat.completions.create(
        model=api.model_id, max_tokens=8,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is add?"}])
    assert reply.object == "chat.completion"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens == 8 or reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    extra = reply.model_extra["codectx"]
    assert extra["prompt_tokens"] == reply.usage.prompt_tokens
    assert extra["cached_tokens"] + extra["recomputed_tokens"] == reply.usage.prompt_tokens


def test_streamed_answer_equals_the_non_streamed_one(client, api):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Explain main()."}]
    whole = client.chat.completions.create(model=api.model_id, messages=messages, max_tokens=12)
    stream = client.chat.completions.create(model=api.model_id, messages=messages, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    assert text == whole.choices[0].message.content  # greedy: same answer, cached or not
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]


def test_repeated_prefix_reports_cached_tokens(client, api):
    system = {"role": "system", "content": "Cache test. " + SYSTEM}
    first = client.chat.completions.create(model=api.model_id, max_tokens=4,
                                           messages=[system, {"role": "user", "content": "first question"}])
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert first.model_extra["codectx"]["miss_reason"]  # named: new prefix or diverged at token N
    second = client.chat.completions.create(model=api.model_id, max_tokens=4,
                                            messages=[system, {"role": "user", "content": "another one"}])
    cached = second.usage.prompt_tokens_details.cached_tokens
    system_tokens = len(api.source.current().tokenizer.encode(f"<|im_start|>system\n{system['content']}<|im_end|>\n"))
    assert cached >= system_tokens - 32  # restored up to the last checkpoint inside the system message
    assert cached < second.usage.prompt_tokens
    assert second.model_extra["codectx"]["recomputed_tokens"] == second.usage.prompt_tokens - cached


def test_repository_model_answers_over_the_warm_workspace(client, api):
    first = client.chat.completions.create(model=REPOSITORY_MODEL, max_tokens=4,
                                           messages=[{"role": "user", "content": "What does util.py hold?"}])
    second = client.chat.completions.create(model=REPOSITORY_MODEL, max_tokens=4,
                                            messages=[{"role": "user", "content": "Who calls add?"}])
    prefix = sum(len(s.token_ids) for s in api.source.prompt.prefix_segments())
    assert first.usage.prompt_tokens > prefix and second.usage.prompt_tokens > prefix
    assert second.usage.prompt_tokens_details.cached_tokens >= prefix


def test_tools_and_template_kwargs_change_the_prompt(client, api):
    messages = [{"role": "user", "content": "list files"}]
    tool = {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}}
    plain = client.chat.completions.create(model=api.model_id, messages=messages, max_tokens=1)
    tools = client.chat.completions.create(model=api.model_id, messages=messages, max_tokens=1, tools=[tool])
    no_thinking = client.chat.completions.create(model=api.model_id, messages=messages, max_tokens=1,
                                                 extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    tokenizer = api.source.current().tokenizer
    assert tools.usage.prompt_tokens - plain.usage.prompt_tokens == len(tokenizer.encode(
        '<|im_start|>system\nTools:\n' + json.dumps(tool) + '\n<|im_end|>\n'))
    assert no_thinking.usage.prompt_tokens - plain.usage.prompt_tokens == len(tokenizer.encode("<think>\n\n</think>\n\n"))


def _error(response) -> dict:
    return response.json()["error"]


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**63 - 1])
def test_any_seed_the_api_accepts_samples_and_repeats(client, api, seed):
    """A negative seed (the API takes any signed 64-bit one) was a 500: MLX's and NumPy's generators take
    unsigned seeds only. Now it samples, and the same seed gives the same answer."""
    messages = [{"role": "user", "content": "Name a fruit."}]
    answers = [client.chat.completions.create(model=api.model_id, messages=messages, max_tokens=6, temperature=1.0,
                                              seed=seed).choices[0].message.content for _ in range(2)]
    assert answers[0] and answers[0] == answers[1]


def test_bad_json_is_a_400(api):
    with api.client() as http:
        response = http.post("/v1/chat/completions", content=b'{"model": ', headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and _error(response)["code"] == "invalid_json"


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "M", "messages": []}, "messages"),
    ({"model": "M", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0]"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": []}},
     "chat_template_kwargs"),
])
def test_invalid_fields_are_named(api, body, param):
    body = {**body, "model": api.model_id} if body.get("model") == "M" else body
    with api.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and _error(response)["param"] == param


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["code"] == "model_not_found"


def test_oversize_prompt_and_body(api):
    long_text = "word " * (MAX_PROMPT_TOKENS + 100)
    with api.client() as http:
        before = api.metrics()["codectx_http_rejected_requests_total"]
        long_prompt = http.post("/v1/chat/completions",
                                json={"model": api.model_id, "messages": [{"role": "user", "content": long_text}]})
        too_big = http.post("/v1/chat/completions", json={"model": api.model_id, "messages": [
            {"role": "user", "content": "x" * (MAX_BODY_BYTES + 1)}]})
    assert long_prompt.status_code == 400 and _error(long_prompt)["code"] == "context_length_exceeded"
    assert too_big.status_code == 413 and _error(too_big)["code"] == "request_too_large"
    assert api.metrics()["codectx_http_rejected_requests_total"] == before + 2
