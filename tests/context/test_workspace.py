"""Layout: golden order, determinism, edits touching only their segment, budget and hysteresis."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from context.access import AccessPolicy
from context import tags
from context.errors import BudgetError
from context.workspace import Workspace

GOLDEN = Path(__file__).parent / "golden" / "fixture_layout.txt"


def _describe(layout) -> str:
    lines = [f"{i:>2} {s.kind:<6} {s.key:<34} {s.hash} {s.reason}" for i, s in enumerate(layout.segments)]
    lines += [f"-- {r.path}: {r.reason}" for r in layout.rows if r.order is None]
    lines += [f"skip {s.path}: {s.reason}" for s in layout.skipped]
    return "\n".join(lines) + "\n"


def test_golden_layout(repo, smol_tokenizer):
    layout = Workspace(repo, smol_tokenizer, persist=False).build()
    text = _describe(layout)
    if os.environ.get("CODECTX_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_dependencies_come_before_dependents(repo, smol_tokenizer):
    keys = [s.key for s in Workspace(repo, smol_tokenizer, persist=False).build().segments]
    before = [("README.md", "app.py"), ("pkg/util.py", "pkg/core.py"), ("pkg/core.py", "app.py"),
              ("web/src/lib.ts", "web/src/index.ts"), ("web/src/index.ts", "web/src/view.tsx"),
              ("internal/store/store.go", "cmd/demo/main.go"), ("crate/src/parser.rs", "crate/src/lib.rs"),
              ("java/com/demo/util/Strings.java", "java/com/demo/App.java"), ("native/vec.h", "native/vec.c")]
    for dep, user in before:
        assert keys.index(dep) < keys.index(user), (dep, user)
    assert keys[:2] == ["system", "README.md"]  # pinned first


def test_shuffled_discovery_gives_identical_layout(repo, smol_tokenizer, monkeypatch):
    reference = Workspace(repo, smol_tokenizer, persist=False, budget=600).build()
    real = AccessPolicy.listing
    for seed in range(3):
        def shuffled(policy, _real=real, _seed=seed):
            listing = _real(policy)
            random.Random(_seed).shuffle(listing.paths)
            return listing
        monkeypatch.setattr(AccessPolicy, "listing", shuffled)
        again = Workspace(repo, smol_tokenizer, persist=False, budget=600).build()
        assert again.segments == reference.segments
        assert again.rows == reference.rows


def _same(a, b) -> bool:
    """Segments byte-identical (kind, key, text, hash and token ids)."""
    return [(s.kind, s.key, s.text, s.hash, s.token_ids) for s in a] == \
        [(s.kind, s.key, s.text, s.hash, s.token_ids) for s in b]


def test_mid_repo_edit_keeps_every_segment_before_the_hot_tail(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    before = ws.build().segments
    old = next(i for i, s in enumerate(before) if s.key == "pkg/util.py")
    assert 0 < old < len(before) - 3  # really in the middle
    first, after = ws.update("pkg/util.py", "def helper(x):\n    return x * 3\n")
    assert first == len(before)
    assert _same(after.segments[:len(before)], before)  # the built copy stays in its place
    assert "x * 2" in after.segments[old].text
    tail = after.segments[-1]
    assert (tail.kind, tail.key, tail.reason) == ("hot", "pkg/util.py", "hot (edited)")
    assert tail.text.startswith('<file path="pkg/util.py" language="python" note="edited; replaces the copy above">')
    assert "x * 3" in tail.text
    assert after.tokens == sum(len(s) for s in before) + len(tail)  # both copies are counted

    # A second edit of the same (hot) file touches only the last segment.
    first, again = ws.update(repo / "pkg/util.py", "def helper(x):\n    return x * 4\n")
    assert first == len(again.segments) - 1
    assert _same(again.segments[:-1], after.segments[:-1])

    # Same text: nothing changes.
    first, same = ws.update("pkg/util.py", "def helper(x):\n    return x * 4\n")
    assert first == len(same.segments) and same.segments == again.segments

    # Back to the built text: the hot copy goes, the layout is the built one again.
    first, undone = ws.update("pkg/util.py", (repo / "pkg/util.py").read_text())
    assert first == len(before) and _same(undone.segments, before)


def test_prompt_after_an_edit_tokenizes_like_the_template(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    ws.build()
    ws.update("pkg/core.py", "from .util import helper\n\n\nclass Core:\n    pass\n")
    ws.update("gone.py", None)
    ws.update("app.py", None)
    segments = ws.prompt("What changed?")
    rendered = ws.template.render(ws.layout.messages("What changed?"))
    assert [t for s in segments for t in s.token_ids] == smol_tokenizer.encode(rendered)


def test_hot_files_keep_the_order_they_became_hot(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    ws.build()
    ws.update("app.py", "print(1)\n")
    ws.update("pkg/core.py", "print(2)\n")
    n = len(ws.layout.segments)
    first, layout = ws.update("app.py", "print(3)\n")
    assert first == n - 2
    assert [s.key for s in layout.segments[-2:]] == ["app.py", "pkg/core.py"]


def test_create_and_delete(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    before = ws.build().segments
    first, layout = ws.update("pkg/new.py", "NEW = 1\n")
    assert first == len(before) and layout.segments[-1].key == "pkg/new.py"
    assert 'note="edited">' in layout.segments[-1].text  # nothing above to replace
    idx = next(i for i, s in enumerate(layout.segments) if s.key == "app.py")
    first, layout = ws.update("app.py", None)
    assert first == len(before) + 1 and layout.segments[idx].key == "app.py"  # its copy stays
    assert (layout.segments[-1].key, layout.segments[-1].reason) == ("app.py", "hot (deleted)")
    assert layout.segments[-1].text == '<file path="app.py" note="deleted; ignore the copy above"/>\n'
    first, layout = ws.update("pkg/new.py", None)  # only ever hot: it just leaves the tail
    assert first == len(before) and [s.key for s in layout.segments[len(before):]] == ["app.py"]
    first, same = ws.update("never/was.py", None)
    assert first == len(same.segments)
    first, skipped = ws.update("node_modules/x/y.js", "x\n")
    assert first == len(skipped.segments)
    assert ("node_modules/x/y.js", "vendored") in [(s.path, s.reason) for s in skipped.skipped]
    folded = ws.build(fold=True).segments
    assert "app.py" not in [s.key for s in folded] and not [s for s in folded if s.kind == "hot"]


def test_hot_tail_over_its_share_folds_back_into_place(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, persist=False, hot_share=0.15)
    before = ws.build()
    edits = ["pkg/util.py", "crate/src/parser.rs", "web/src/lib.ts", "internal/store/store.go",
             "native/vec.h", "java/com/demo/util/Strings.java"]
    places = {p: before.index_of("file", p) for p in edits}
    layout, firsts = before, []
    for n, path in enumerate(edits):
        text = (repo / path).read_text() + f"// edit {n}\n" * 3
        first, layout = ws.update(path, text)
        firsts.append(first)
        if not [s for s in layout.segments if s.kind == "hot"]:
            break
    else:
        pytest.fail("the hot tail never folded")
    hot_before = sum(len(s) for s in before.segments) * 0.15
    assert n > 0 and len(layout.segments) == len(before.segments)  # folded: one copy per file
    assert firsts[-1] == min(places[p] for p in edits[:n + 1])    # recomputed from the first edit on
    for p in edits[:n + 1]:
        seg = layout.segments[layout.index_of("file", p)]
        assert "edit" in seg.text and seg.reason.endswith("; edited")
    assert hot_before > 0


def test_restart_rebuilds_the_same_hot_tail(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer)
    ws.build()
    text = "def helper(x):\n    return x * 5\n"
    (repo / "pkg/util.py").write_text(text)
    ws.update("pkg/util.py", text)
    restarted = Workspace(repo, smol_tokenizer).build()
    assert _same(restarted.segments, ws.layout.segments)
    folded = Workspace(repo, smol_tokenizer).build(fold=True)
    assert not [s for s in folded.segments if s.kind == "hot"]
    assert "x * 5" in folded.segments[folded.index_of("file", "pkg/util.py")].text
    again = Workspace(repo, smol_tokenizer).build()  # the fold is remembered
    assert _same(again.segments, folded.segments)


def test_update_is_o_changed_file(repo, smol_tokenizer, monkeypatch):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    ws.build()
    parsed: list[str] = []
    real = tags.extract
    monkeypatch.setattr(tags, "extract", lambda lang, text: parsed.append(lang) or real(lang, text))
    monkeypatch.setattr(AccessPolicy, "listing", lambda policy: pytest.fail("update rescanned"))
    misses = ws.tokens.misses
    ws.update("crate/src/parser.rs", "pub struct Parser2;\n")
    assert parsed == []  # tags are parsed on the next build, not in the update
    assert ws.tokens.misses == misses + 1
    monkeypatch.undo()
    monkeypatch.setattr(tags, "extract", lambda lang, text: parsed.append(lang) or real(lang, text))
    ws.build(fold=True)
    assert parsed == ["rust"]  # only the changed file: the others hit the tag cache


@pytest.mark.parametrize("budget", [900, 1000, 1200])
def test_budget_is_never_exceeded_and_selection_is_stable(repo, smol_tokenizer, budget):
    ws = Workspace(repo, smol_tokenizer, persist=False, budget=budget)
    layout = ws.build()
    assert layout.tokens <= budget - int(budget * ws.hot_share)  # room kept for the hot tail
    kinds = {s.kind for s in layout.segments}
    assert "map" in kinds
    whole = {s.key for s in layout.segments if s.kind == "file"}
    edited = []
    for n in range(5):  # small edits to files that are in
        path = sorted(whole)[n % len(whole)] if whole else "app.py"
        text = (repo / path).read_text() + f"# edit {n}\n"
        previous = layout
        first, layout = ws.update(path, text)
        edited.append(path)
        assert layout.tokens <= budget
        hot = [i for i, s in enumerate(layout.segments) if s.kind == "hot"]
        if hot:  # in the tail: nothing before it moved
            assert first >= hot[0] and _same(layout.segments[:hot[0]], previous.segments[:hot[0]])
        else:    # folded: every edited file is whole, in its place
            assert all(layout.index_of("file", p) is not None for p in edited)
        (repo / path).write_text(text)
    # A fold keeps every edited file whole (edits are kept first) and empties the tail.
    rebuilt = ws.build(fold=True)
    assert rebuilt.tokens <= budget - int(budget * ws.hot_share)
    assert all(rebuilt.index_of("file", p) is not None for p in edited)
    assert not [s for s in rebuilt.segments if s.kind == "hot"]


def test_hysteresis_keeps_selection_when_ranks_shift(repo, smol_tokenizer):
    budget = 1000
    ws = Workspace(repo, smol_tokenizer, persist=False, budget=budget)
    first = {s.key for s in ws.build().segments if s.kind == "file"}
    # Shift ranks a little: one more file references helper().
    (repo / "extra.py").write_text("from pkg.util import helper\nhelper(1)\n")
    warm = {s.key for s in ws.build().segments if s.kind in ("file", "hot")}
    assert first <= warm


def test_budget_too_small_raises(repo, smol_tokenizer):
    with pytest.raises(BudgetError):
        Workspace(repo, smol_tokenizer, persist=False, budget=5).build()


def test_changed_on_disk_since_last_build_takes_its_place(repo, smol_tokenizer):
    built = Workspace(repo, smol_tokenizer).build()
    (repo / "pkg/util.py").write_text("def helper(x):\n    return 0\n")
    layout = Workspace(repo, smol_tokenizer).build()
    at = layout.index_of("file", "pkg/util.py")
    assert at == built.index_of("file", "pkg/util.py") and not [s for s in layout.segments if s.kind == "hot"]
    assert layout.segments[at].reason.endswith("; changed on disk") and "return 0" in layout.segments[at].text


def test_persistent_token_cache_is_reused(repo, smol_tokenizer):
    Workspace(repo, smol_tokenizer).build()
    ws = Workspace(repo, smol_tokenizer)
    ws.build()
    assert ws.tokens.misses == 0 and ws.tokens.hits > 10


def test_context_never_imports_mlx():
    code = ("import sys, context.workspace, context.prompt, context.hf_tokenizer; "
            "assert not any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules), 'mlx imported'")
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_many_changes_at_once_fold_once(repo, smol_tokenizer):
    """A replace in many open buffers of a budgeted workspace: the server records every change before it applies
    any (`WorkspacePrompt._flush`), so the fold on the way sees them all and is the only one (applied one at a
    time, each change after a fold overflowed the tail again: a full rebuild per file)."""
    from server.core.prompt import WorkspacePrompt
    from server.core.settings import ContextSettings

    buffers: dict = {}
    prompt = WorkspacePrompt(repo, smol_tokenizer, buffers.get, "", ContextSettings(budget_tokens=1500))
    folds = []
    build = prompt.workspace.build
    prompt.workspace.build = lambda fold=False: (folds.append(fold), build(fold))[1]
    changed = sorted(prompt.workspace.files)
    for n, rel in enumerate(changed):
        buffers[repo / rel] = (repo / rel).read_text() + f"\n// replaced {n}\n" * 8
        prompt.mark_dirty(repo / rel)
    prompt.prefix_segments()  # applies the changes
    assert len(changed) > 5 and folds == [True]
    assert all(prompt.workspace.files[rel].text == buffers[repo / rel] for rel in changed)
    placed = [s for s in prompt.workspace.layout.segments if s.kind == "file"]
    assert placed and all(s.reason.endswith("; edited") for s in placed)  # buffer edits, not "changed on disk"


def test_changes_a_failed_flush_did_not_apply_are_applied_by_the_next(repo, smol_tokenizer):
    """A flush that fails part way (a full disk under the hot tail's file) loses no marked change: the next
    prompt applies them (the marks are taken before the changes are applied, and put back on a failure)."""
    from server.core.prompt import WorkspacePrompt
    from server.core.settings import ContextSettings

    buffers: dict = {}
    prompt = WorkspacePrompt(repo, smol_tokenizer, buffers.get, "", ContextSettings())
    changed = sorted(prompt.workspace.files)[:3]
    for rel in changed:
        buffers[repo / rel] = (repo / rel).read_text() + "\n// edited\n"
        prompt.mark_dirty(repo / rel)
    update = prompt.workspace.update

    def full_disk(path, text, apply=True):
        if apply:
            raise OSError(28, "No space left on device")
        return update(path, text, apply=apply)

    prompt.workspace.update = full_disk
    with pytest.raises(OSError):
        prompt.settle()
    prompt.workspace.update = update
    prompt.settle()
    assert all(prompt.workspace.files[rel].text == buffers[repo / rel] for rel in changed)
