"""First use through the real processes: an empty question is refused with the one message
everywhere (the CLI and the language server here; HTTP in tests/http/test_first_use_http.py)."""
from __future__ import annotations

import pytest
from pygls.exceptions import JsonRpcException

from server.core.question import EMPTY_QUESTION
from tests.server.harness import command
from tests.server.shared_server import SHARED
from tests.server.test_cli import codectx


@pytest.mark.parametrize("question", ["", "   ", "\n\t "])
def test_cli_ask_refuses_an_empty_question(question, tmp_path):
    result = codectx("ask", "--repo", ".", question, home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"codectx ask: {EMPTY_QUESTION}"
    assert result.stdout == ""


@SHARED
@pytest.mark.parametrize("question", ["", "   "])
async def test_lsp_ask_refuses_an_empty_question(shared, question):
    with pytest.raises(JsonRpcException) as raised:
        await command(shared, "codectx.ask", question=question, maxTokens=4)
    assert raised.value.code == -32602 and EMPTY_QUESTION in raised.value.message
    result = await command(shared, "codectx.ask", question="What does add do?", maxTokens=4)
    assert result["finishReason"] in ("stop", "length") and result["metrics"]["decode_tokens"] >= 1
