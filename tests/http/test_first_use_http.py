"""First use over HTTP: a chat whose last user message is empty is refused before any work,
with the core's message in an OpenAI-style error body; the server answers normally after."""
from __future__ import annotations

import pytest

from server.core.question import EMPTY_QUESTION


@pytest.mark.parametrize("content", ["", "   ", [{"type": "text", "text": " \n"}]])
@pytest.mark.parametrize("model", ["served", "codectx"])
def test_an_empty_last_user_message_is_a_400(api, content, model):
    model = api.model_id if model == "served" else model
    messages = [{"role": "user", "content": "What does add do?"}, {"role": "assistant", "content": "It adds."},
                {"role": "user", "content": content}]
    with api.client() as http:
        response = http.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 4})
        assert response.status_code == 400
        assert response.json() == {"error": {"message": EMPTY_QUESTION, "type": "invalid_request_error",
                                             "param": "messages[2].content", "code": "empty_question"}}
        ok = http.post("/v1/chat/completions", json={"model": model, "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "Hi"}]})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_metrics_and_monitor_count_requests_by_outcome(api):
    from server.http.prometheus import parse

    def counted(http) -> tuple[dict, dict]:
        metrics = parse(http.get("/metrics").text)
        state = http.get("/monitor/state").json()
        return metrics, state["outcomes"].get("http", {})

    with api.client() as http:
        before, shown_before = counted(http)
        done = http.post("/v1/chat/completions", json={"model": api.model_id, "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "Hi"}]})
        assert done.status_code == 200
        reason = done.json()["choices"][0]["finish_reason"]
        after, shown = counted(http)
    name = f'codectx_requests_total{{kind="http",outcome="{reason}"}}'
    assert after[name] == before.get(name, 0) + 1
    assert shown[reason] == shown_before.get(reason, 0) + 1 == after[name]
