"""Focus through the language server: `codectx.ask` at a cursor focuses the identifier there,
`codectx.showContext {question}` shows the focus an ask would get (real server over stdio)."""
from __future__ import annotations

import pytest
from pygls.exceptions import JsonRpcException

from tests.server.harness import command
from tests.server.shared_server import SHARED


def _range(line: int, character: int) -> dict:
    return {"start": {"line": line, "character": character}, "end": {"line": line, "character": character}}


@SHARED
async def test_ask_at_the_cursor_focuses_its_definition(shared):
    main = shared.root / "main.py"
    result = await command(shared, "codectx.ask", question="What does this do?", maxTokens=4,
                           uri=main.as_uri(), range=_range(4, 11))  # on `greet` in main()
    items = [(i["path"], i["name"], i["reason"]) for i in result["focus"]["items"]]
    assert items == [("util.py", "greet", "under the cursor"), ("main.py", "", "the cursor's file")]
    assert result["focus"]["tokens"] <= result["focus"]["budget"] and result["text"] is not None
    plain = await command(shared, "codectx.ask", question="Hello?", maxTokens=2)  # still answers; no focus
    assert plain["focus"]["items"] == [] and plain["finishReason"] in ("stop", "length")


@SHARED
async def test_show_context_with_a_question_shows_the_focus(shared):
    shown = await command(shared, "codectx.showContext", question="What does add() return?")
    assert [(i["path"], i["name"]) for i in shown["focus"]["items"]] == [("util.py", "add")]
    assert "util.py:4-6 add" in shown["markdown"] and "named in the question (add())" in shown["markdown"]
    with pytest.raises(JsonRpcException, match="'question' must be a non-empty string"):
        await command(shared, "codectx.showContext", question="   ")
    assert (await command(shared, "codectx.showContext"))["focus"] is None  # still answers
