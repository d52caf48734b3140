"""The default model's real tokenizer and template, through the engine's Tokenizer."""
from __future__ import annotations

import pytest

from context.tokenizer import TextTokenizer
from context.workspace import Workspace


@pytest.mark.default_model
def test_segments_match_hf_chat_template_of_default_model(default_model_path, repo):
    from transformers import AutoTokenizer

    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_hf(AutoTokenizer.from_pretrained(str(default_model_path)))
    assert isinstance(tok, TextTokenizer)
    for budget in (None, 900):
        ws = Workspace(repo, tok, budget=budget, tools="search(query): find code", persist=False)
        layout = ws.build()
        ws.update("pkg/util.py", "def helper(x):\n    return x * 3\n\n\n")
        for question, turns in (("What does 2 + 2 return?", ()),
                                ("And Core?", (("user", "Hi"), ("assistant", "Hello.")))):
            segments = ws.prompt(question, turns)
            rendered = tok.render_chat([{"role": r, "content": c} for r, c in ws.layout.messages(question, turns)])
            assert "".join(s.text for s in segments) == rendered  # our Jinja == transformers' Jinja
            assert [t for s in segments for t in s.token_ids] == tok.encode(rendered)
        assert budget is None or layout.tokens <= budget
