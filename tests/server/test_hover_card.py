"""The hover card counts the files that refer to the name; the grounded head carries the
signatures of what the definition uses. In process through the core, with the tiny model."""
from __future__ import annotations

import asyncio
from pathlib import Path

from server.core.features import hover
from server.core.features.symbols import DefinitionIndex
from tests.definition_sources import CALLS
from tests.server.harness import default_options, edit_buffer, loaded_host
from tests.server.test_hover_layout import Recorder

WIDE = 12
LIB = CALLS + "".join(f'''

def far_{i}(alpha, beta):
    return {i}
''' for i in range(WIDE)) + '''

def wide():
    return ''' + " + ".join(f"far_{i}(1, 2)" for i in range(WIDE)) + "\n"
FILES = {"lib.py": LIB,
         "one.py": "from lib import helper\n\n\ndef f():\n    return helper(1)\n",
         "two.py": "import lib\n\n\ndef g():\n    return lib.helper(2)\n",
         "three.py": "def h():\n    return 3\n"}


def write_repo(root: Path) -> Path:
    """`helper` is defined in lib.py and called from one.py and two.py, not from three.py."""
    for name, text in FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


async def host_on(model: Path, root: Path, budget_ms: int):
    options = default_options(model, hover={"maxTokens": 4, "latencyBudgetMs": budget_ms, "prefetch": 0,
                                            "prefetchHeads": False})
    return await loaded_host(options, root)


async def test_the_card_counts_the_files_that_refer_to_the_name(tiny_model, tmp_path):
    root = write_repo(tmp_path)
    host = await host_on(tiny_model, root, 0)
    session = host.ready_now()
    try:
        assert sorted(p.name for p in session.prompt.files) == sorted(FILES)
        card = await hover.explain(session, session.hover_cache, "helper", root / "one.py", session.prompt.files)
        assert card.source == "signature" and card.markdown.endswith(
            "```\ndef helper(x):\n```\n\nReferenced in 2 of 4 files in context.\n\n" + hover.PENDING_LINE)
        await asyncio.gather(*session.hover_cache.pending.values())

        edit_buffer(host, root / "three.py", 1, 0, "from lib import helper\nX = helper(0)\n")
        again = await hover.explain(session, session.hover_cache, "helper", root / "one.py", session.prompt.files)
        # The edit is elsewhere: the answer is the cached one, the count is the current one.
        assert again.source == "cache" and again.markdown.endswith("Referenced in 3 of 4 files in context.")
        assert again.markdown.split("\n\n")[1].startswith("`helper` is")
    finally:
        host.close()
    # While the model loads only the hovered file is searched: the card has no count.
    loading = hover.static_card(DefinitionIndex(lambda p: p.read_text(encoding="utf-8")), "helper",
                                root / "lib.py", [root / "lib.py"])
    assert "Referenced" not in loading.markdown and loading.markdown.endswith(hover.LOADING_LINE)


async def test_an_answer_finished_before_its_done_callback_ran_is_served_as_the_cache(tiny_model, tmp_path):
    """A hover that comes between an answer's end and its storing (the task's done callback runs on a later turn of
    the event loop) is a cache hit: nothing is generated for it, and the counters say so. (Served as the model's
    answer before, with no hit counted: the VS Code client's end-to-end test failed on that race under load.)"""
    root = write_repo(tmp_path)
    host = await host_on(tiny_model, root, 0)
    session = host.ready_now()
    cache = session.hover_cache
    try:
        first = await hover.explain(session, cache, "helper", root / "one.py", session.prompt.files)
        assert first.source == "signature"
        (key, task), = cache.pending.items()
        await asyncio.gather(task)
        text = cache.answers.pop(key)  # as it was before `_store` ran: done, still pending, not in the cache
        cache.pending[key] = task
        hits = session.counters.hover_cache_hits
        again = await hover.explain(session, cache, "helper", root / "one.py", session.prompt.files)
        assert again.source == "cache" and again.markdown.split("\n\n")[1].startswith(text[:20])
        assert session.counters.hover_cache_hits == hits + 1
    finally:
        host.close()


async def test_the_head_quotes_the_signatures_of_the_callees_first_named_first(tiny_model, tmp_path):
    root = write_repo(tmp_path)
    host = await host_on(tiny_model, root, 60000)
    session = host.ready_now()
    session.backend = Recorder(session.backend)
    try:
        site = session.hover_cache.index.find("combine", root / "lib.py", session.prompt.files)
        head, tail = hover.answer_start(session, site)
        # zoom, then scale (the order combine names them); combine itself and `missing`
        # (defined nowhere) are left out.
        assert head.startswith("Uses:\n```\ndef zoom(a):\ndef scale(v, k):\n```\n`combine` (lib.py, line 13):\n"
                               "```\ndef combine(a, b):\n") and tail == " is"
        assert "missing" not in head.split("`combine` (lib.py")[0]

        cold = await hover.explain(session, session.hover_cache, "combine", root / "lib.py", session.prompt.files)
        assert cold.source == "model" and cold.markdown.split("\n\n")[1].startswith("`combine` is")
        cold_request, _ = session.backend.served[-1]
        assert cold_request.segments[-2].token_ids == tuple(session.tokenizer.encode(head))
        # Another cache, the same inputs: the same tokens, and the head the first hover left is restored.
        fresh = hover.HoverCache(session.read_text)
        again = await hover.explain(session, fresh, "combine", root / "lib.py", session.prompt.files)
        again_request, again_done = session.backend.served[-1]
        assert again.source == "model" and again_request.all_token_ids() == cold_request.all_token_ids()
        head_end = again_done.metrics.prompt_tokens - len(again_request.segments[-1].token_ids)
        assert again_done.metrics.cached_tokens == head_end
    finally:
        host.close()


async def test_the_callee_signatures_stay_within_their_budget(tiny_model, tmp_path):
    root = write_repo(tmp_path)
    host = await host_on(tiny_model, root, 60000)
    session = host.ready_now()
    try:
        encode = session.tokenizer.encode
        site = session.hover_cache.index.find("wide", root / "lib.py", session.prompt.files)
        lines = hover.uses(session, site).splitlines()
        signatures = [f"def far_{i}(alpha, beta):" for i in range(WIDE)]
        assert 2 <= len(lines) < WIDE and lines == signatures[:len(lines)]  # the first named that fit
        assert len(encode("\n".join(lines))) <= hover.HOVER_CALLEE_TOKENS
        assert len(encode("\n".join(signatures[:len(lines) + 1]))) > hover.HOVER_CALLEE_TOKENS
        head, _ = hover.answer_start(session, site)
        assert head.startswith("Uses:\n```\n" + "\n".join(lines) + "\n```\n`wide` (lib.py,")
        answer = await hover.explain(session, session.hover_cache, "wide", root / "lib.py", session.prompt.files)
        assert answer.source == "model" and "Referenced in 0 of 4 files in context." in answer.markdown
    finally:
        host.close()
