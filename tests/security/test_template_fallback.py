"""A chat template codectx cannot split never takes the server to a second, unguarded prompt builder.

The old server fell back to its own prompt builder when the segment builder rejected a
template: that builder ignored .gitignore and blocked forever opening a FIFO. Now
`context.chat.ChatTemplate.usable` is the one fallback: the same workspace, the same access
policy, ChatML framing, and a note that says so. A template that only trims contents
(Llama 3, Gemma) is framed as it is, with no fallback.
"""
from __future__ import annotations

import asyncio
import os

from context.chat import DEFAULT_TEMPLATE, ChatTemplate
from context.hf_tokenizer import HFTokenizer
from context.workspace import Workspace
from tests.security.lsp_session import TIMEOUT, ask, model_with_template, prompt_keys, served, show_context, \
    skip_reasons
from tests.server.harness import command, write_sample_workspace

UPPER = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TRIM = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SECRET = "S3CRET-"


def fallback_workspace(root):
    """The sample workspace, a .gitignore'd secret and a FIFO (outside git: the walk reads them)."""
    root.mkdir()
    write_sample_workspace(root)
    (root / ".gitignore").write_text("private.py\n", encoding="utf-8")
    (root / "private.py").write_text(f"KEY = '{SECRET}ignored'\n", encoding="utf-8")
    os.mkfifo(root / "pipe.py")
    return root


async def test_unsplittable_template_is_chatml_over_the_same_policy(tmp_path):
    root = fallback_workspace(tmp_path / "ws")
    async with served(root, model_with_template("upper", UPPER)) as client:
        context = await show_context(client)  # waits for the load and the scan: a hang fails here
        load = next(reports for token, reports in client.progress_reports.items()
                    if str(token).startswith("codectx-load"))
        assert load[-1].kind == "end" and load[-1].message == "ready"
        assert prompt_keys(context) == {"util.py", "main.py", ".gitignore"}
        reasons = skip_reasons(context)
        assert reasons["private.py"] == "ignored" and reasons["pipe.py"] == "not a regular file (a FIFO)"
        assert len(context["notes"]) == 1 and "prompts use ChatML framing" in context["notes"][0]
        assert "cannot be split into segments" in context["notes"][0]
        assert "note: " in context["markdown"] and "skipped: 2" in context["markdown"]
        await ask(client)
        status = await asyncio.wait_for(command(client, "codectx.status"), TIMEOUT)
        assert status["ready"] is True and status["counters"]["asks"] == 1


def test_trimming_template_is_framed_without_fallback(tmp_path):
    template, note = ChatTemplate.usable(TRIM)
    assert note is None and template.source == TRIM and template.trims
    assert ChatTemplate.usable(UPPER)[0].source == DEFAULT_TEMPLATE

    tokenizer = HFTokenizer.from_dir(model_with_template("trim", TRIM))
    root = fallback_workspace(tmp_path / "ws")
    ws = Workspace(root, tokenizer, persist=False)
    layout = ws.build()
    assert layout.notes == () and ws.template.trims
    assert {row.path for row in layout.rows} == {"util.py", "main.py", ".gitignore"}
    turns = [("user", "  earlier question \n"), ("assistant", "an answer\n")]
    segments = ws.prompt("  What does add do?\n", turns)
    text = "".join(s.text for s in segments)
    ids = [t for s in segments for t in s.token_ids]
    assert ids == tokenizer.encode(text)  # segment by segment = the whole text at once
    # The template strips every content; codectx strips what it controls (turns, question), and the
    # repository's system content keeps its surrounding whitespace (ChatTemplate.trims).
    system = layout.system_content()
    rendered = ws.template.render(layout.messages("  What does add do?\n", turns))
    assert system != system.strip() and rendered == text.replace(system, system.strip(), 1)
    assert SECRET not in text
