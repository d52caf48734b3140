"""OpenAI messages -> prompt segments on the plain model (real tokenizer, real template)."""
from __future__ import annotations

import pytest

from engine.loading import load_model
from server.http.chat_prompt import message_segments, render_messages, repository_turns
from server.http.errors import BadRequestError

MESSAGES = [
    {"role": "system", "content": "You answer questions about Python code."},
    {"role": "user", "content": "What does add do?"},
    {"role": "assistant", "content": "It adds two numbers."},
    {"role": "user", "content": "And naïve café 🙂?"},
]
TOOL = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                         "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tokenizer(http_model):
    return load_model(str(http_model), progress=False).tokenizer


def _ids(segments):
    return [t for s in segments for t in s.token_ids]


def test_segments_concatenate_to_the_rendered_prompt(tokenizer):
    segments = message_segments(tokenizer, MESSAGES)
    assert _ids(segments) == tokenizer.encode(tokenizer.render_chat(MESSAGES, add_generation_prompt=True))
    assert [s.kind for s in segments] == ["system", "turn", "turn", "question", "header"]
    assert segments[0].protected and not segments[1].protected
    assert tokenizer.decode(segments[-1].token_ids) == "<|im_start|>assistant\n"
    assert tokenizer.decode(segments[1].token_ids) == "<|im_start|>user\nWhat does add do?<|im_end|>\n"


def test_a_longer_conversation_extends_the_same_ids(tokenizer):
    short = message_segments(tokenizer, MESSAGES[:2])
    long = message_segments(tokenizer, MESSAGES)
    assert [s.token_ids for s in long[:2]] == [s.token_ids for s in short[:2]]


def test_tools_and_template_kwargs_reach_the_template(tokenizer):
    plain = _ids(message_segments(tokenizer, MESSAGES))
    with_tools = message_segments(tokenizer, MESSAGES, tools=[TOOL])
    text = tokenizer.decode(_ids(with_tools))
    assert '"name": "read_file"' in text and len(_ids(with_tools)) > len(plain)
    assert _ids(with_tools) == tokenizer.encode(render_messages(tokenizer, MESSAGES, tools=[TOOL]))
    no_thinking = message_segments(tokenizer, MESSAGES, template_kwargs={"enable_thinking": False})
    assert tokenizer.decode(no_thinking[-1].token_ids).endswith("<think>\n\n</think>\n\n")
    assert tokenizer.decode(_ids(no_thinking)).startswith(tokenizer.decode(plain))


def test_developer_role_renders_as_system(tokenizer):
    segments = message_segments(tokenizer, [{"role": "developer", "content": "Be brief."},
                                            {"role": "user", "content": "hi"}])
    assert segments[0].kind == "system"
    assert tokenizer.decode(segments[0].token_ids).startswith("<|im_start|>system\n")


def test_repository_turns_need_a_final_user_message():
    turns = repository_turns([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], [TOOL])
    assert turns[0][0] == "system" and "read_file" in turns[0][1]
    assert turns[1:] == [("system", "s"), ("user", "q")]
    with pytest.raises(BadRequestError):
        repository_turns([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
