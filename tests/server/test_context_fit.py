"""Requests stay inside the model's context: a long conversation's oldest exchanges leave the prompt,
an answer is shortened to the room left, a tool result that cannot fit is replaced by a note, and a
question or code that cannot fit beside the repository prefix is refused without losing the
conversation (scripted model output, byte tokens: one token a byte, so every size here is exact)."""
from __future__ import annotations

import logging

import pytest

from server.core.features import code_actions
from server.core.features.ask import ask
from server.core.features.status import show_context
from server.core.prefix_budget import QUESTION_TOKENS, RESERVED_TOKENS, server_context
from server.core.prompt_size import PromptTooLongError
from server.core.settings import parse_settings
from tests.server.harness import build_server_test_model, default_options, loaded_host, write_sample_workspace
from tests.server.scripted import ByteTokenizer, session_for
from tests.server.test_tools import tools_for

ANSWER_TOKENS = 64


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    return write_sample_workspace(root)


def prompt_of(request) -> str:
    return ByteTokenizer().decode(request.all_token_ids())


def prefix_tokens(session) -> int:
    return sum(len(segment.token_ids) for segment in session.prompt.prefix_segments())


async def test_a_long_conversation_keeps_its_newest_exchanges_within_the_context(repo):
    answers = [f"answer-{n} " + "words " * 60 for n in range(8)]
    session, engine = session_for(repo, answers, focus={"enabled": False})
    session.backend.context_length = prefix_tokens(session) + 1200  # room for about two exchanges
    conversation, results = None, []
    for n in range(8):
        results.append(await ask(session, f"question-{n}?", on_text=lambda t: None, conversation_id=conversation,
                                 max_tokens=ANSWER_TOKENS))
        conversation = results[-1].conversation_id
    sizes = [len(request.all_token_ids()) for request in engine.requests]
    assert max(sizes) + ANSWER_TOKENS <= session.backend.context_length, sizes
    assert results[0].dropped_turns == 0 and sum(r.dropped_turns for r in results) > 0
    assert results[-1].as_dict()["droppedTurns"] == results[-1].dropped_turns
    last = prompt_of(engine.requests[-1])
    assert "question-0?" not in last and "answer-0" not in last
    assert last.index("question-6?") < last.index("answer-6") < last.index("question-7?")  # the newest exchange stays
    _, history = session.base.conversations.get(conversation)
    assert len(history) % 2 == 0 and history[-2].content == "question-7?"
    assert all("question-0?" != turn.content for turn in history)  # what left the prompt is not kept


async def test_history_gives_way_to_the_focus_a_question_gets_not_to_the_whole_focus_budget(repo):
    answers = ["answer-0 " + "words " * 60, "answer-1 " + "words " * 60, "answer-2"]
    session, engine = session_for(repo, answers)  # focus on, 1,024 tokens of budget
    session.backend.context_length = prefix_tokens(session) + 1100  # one exchange and the whole budget do not fit
    first = await ask(session, "question-0?", on_text=lambda t: None, max_tokens=ANSWER_TOKENS)
    plain = await ask(session, "question-1?", on_text=lambda t: None, conversation_id=first.conversation_id,
                      max_tokens=ANSWER_TOKENS)
    assert plain.focus["tokens"] == 0 and plain.dropped_turns == 0  # nothing named: the whole history stays
    assert "question-0?" in prompt_of(engine.requests[1])
    named = await ask(session, "What does greet in util.py do?", on_text=lambda t: None,
                      conversation_id=first.conversation_id, max_tokens=ANSWER_TOKENS)
    assert named.focus["tokens"] > 0 and named.dropped_turns > 0  # history gives way to the focus
    assert len(engine.requests[2].all_token_ids()) + ANSWER_TOKENS <= session.backend.context_length


async def test_an_answer_longer_than_the_room_left_is_shortened_after_the_oldest_turns_leave(repo):
    session, engine = session_for(repo, ["answer-0 " + "words " * 60, "short"], focus={"enabled": False})
    session.backend.context_length = prefix_tokens(session) + 600
    first = await ask(session, "question-0?", on_text=lambda t: None, max_tokens=ANSWER_TOKENS)
    second = await ask(session, "question-1?", on_text=lambda t: None, conversation_id=first.conversation_id,
                       max_tokens=1000)
    prompt = engine.requests[1]
    assert second.dropped_turns == 2 and "question-0?" not in prompt_of(prompt)  # history goes before the answer
    assert prompt.max_tokens == session.backend.context_length - len(prompt.all_token_ids())


async def test_a_question_that_fits_alone_but_not_beside_the_prefix_is_refused_and_the_conversation_kept(repo):
    session, engine = session_for(repo, ["first answer"], focus={"enabled": False})
    session.backend.context_length = prefix_tokens(session) + 400
    first = await ask(session, "What does add do?", on_text=lambda t: None, max_tokens=ANSWER_TOKENS)
    selection = "y = 1\n" * 100  # 600 tokens: fits the context alone, not beside the prefix
    with pytest.raises(PromptTooLongError, match=r"come to \d+ tokens, which leave less than 32 tokens of the "
                                                 r"model's context of \d+ for an answer: select less"):
        await ask(session, "And this?", on_text=lambda t: None, conversation_id=first.conversation_id,
                  selection=selection, max_tokens=ANSWER_TOKENS)
    assert len(engine.requests) == 1  # the engine never saw it
    _, history = session.base.conversations.get(first.conversation_id)
    assert [turn.content for turn in history] == ["What does add do?", "first answer "]


async def test_a_tool_result_that_cannot_fit_is_replaced_by_a_note(repo):
    (repo / "big.py").write_text("value = 12345\n" * 400, encoding="utf-8")
    call = '<tool_call>{"name": "read_file", "arguments": {"path": "big.py"}}</tool_call>'
    session, engine = session_for(repo, [call, "answered without it"], focus={"enabled": False})
    session.backend.context_length = prefix_tokens(session) + 600  # the call and a note fit; 4,000 characters do not
    result = await ask(session, "What is in big.py?", on_text=lambda t: None, tools=tools_for(repo),
                       max_tokens=ANSWER_TOKENS)
    second = prompt_of(engine.requests[1])
    assert "<tool_response>\nerror: the result does not fit in the model's context" in second
    assert result.tool_calls[0]["resultChars"] > 4000 and "<tool_response>\n1: value" not in second
    assert len(engine.requests[1].all_token_ids()) + ANSWER_TOKENS <= session.backend.context_length
    assert result.finish_reason == "stop" and result.text.endswith("answered without it ")


async def test_a_tool_round_with_no_room_even_for_the_note_ends_the_answer_as_length(repo):
    call = '<tool_call>{"name": "read_file", "arguments": {"path": "util.py"}}</tool_call>'
    session, engine = session_for(repo, [call], focus={"enabled": False})
    session.backend.context_length = prefix_tokens(session) + 200  # the question fits; its tool round does not
    pieces: list[str] = []
    result = await ask(session, "What does add do?", on_text=pieces.append, tools=tools_for(repo),
                       max_tokens=ANSWER_TOKENS)
    assert len(engine.requests) == 1 and result.finish_reason == "length"
    assert result.text == "".join(pieces) and result.text.endswith("[no room left in the model's context for "
                                                                   "another round]\n")


async def test_code_actions_shorten_their_answer_or_refuse_code_that_cannot_fit(repo):
    session, engine = session_for(repo, ["12: looks wrong"], focus={"enabled": False})
    session.backend.context_length = prefix_tokens(session) + 1400
    await code_actions.find_bugs(session, "x = 1\n" * 80, 0)  # about 1,000 tokens numbered: the answer gets the rest
    request = engine.requests[0]
    assert request.max_tokens == session.backend.context_length - len(request.all_token_ids()) < 512
    with pytest.raises(PromptTooLongError, match=r"the code with the repository prefix comes to \d+ tokens, which "
                                                 r"leave too little of the model's context of \d+ for an answer"):
        await code_actions.find_bugs(session, "x = 1\n" * 200, 0)
    assert len(engine.requests) == 1


def test_a_server_prefix_budget_leaves_the_model_room_for_an_ask(caplog):
    caplog.set_level(logging.INFO, logger="server.core.prefix_budget")
    settings, _ = parse_settings({"context": {"budgetTokens": 20000}})
    lowered = server_context(settings, 8192)
    assert lowered.budget_tokens == 8192 - QUESTION_TOKENS - 1024 - 512 - RESERVED_TOKENS  # focus, answer, framing
    assert "context.budgetTokens 20000 leaves no room for an ask" in caplog.text
    without_focus, _ = parse_settings({"context": {"budgetTokens": 20000}, "focus": {"enabled": False}})
    assert server_context(without_focus, 8192).budget_tokens == lowered.budget_tokens + 1024
    caplog.clear()
    assert server_context(parse_settings(None)[0], 8192).budget_tokens == 6000 and caplog.text == ""  # the default fits


async def test_a_server_builds_its_prefix_within_the_model_context(tmp_path):
    """A budget far past the model's context (the tiny model reads 4,096 tokens) is lowered where the
    server loads the workspace: its prefix leaves an ask room."""
    root = tmp_path / "repo"
    root.mkdir()
    for n in range(30):  # about 12,000 tokens of source
        (root / f"mod{n}.py").write_text("".join(f"def f{n}_{i}(x):\n    return x + {i}\n" for i in range(40)))
    model = build_server_test_model(tmp_path / "model")
    host = await loaded_host(default_options(model, context={"budgetTokens": 10**6}), root)
    try:
        session = host.ready_now()
        context_length = session.backend.context_length
        budget = server_context(session.settings, context_length).budget_tokens
        assert session.prompt.workspace.layout.budget == budget < context_length == 4096
        assert prefix_tokens(session) <= budget
        shown = show_context(session, session.prompt.layout(), session.warmup.segment_states())
        assert shown["budget"] == budget
        assert (f"budget: {budget} tokens (context.budgetTokens 1000000, lowered to leave an ask room in the "
                f"model's context of 4096 tokens)") in shown["markdown"].splitlines()
    finally:
        host.close()
