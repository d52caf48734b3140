"""Layout: golden order, determinism, edits touching only their segment, budget and hysteresis."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from context import scan as scanning
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
    real = scanning.list_paths
    for seed in range(3):
        def shuffled(root, _real=real, _seed=seed):
            paths, git = _real(root)
            random.Random(_seed).shuffle(paths)
            return paths, git
        monkeypatch.setattr("context.workspace.list_paths", shuffled)
        again = Workspace(repo, smol_tokenizer, persist=False, budget=600).build()
        assert again.segments == reference.segments
        assert again.rows == reference.rows


def test_edit_changes_only_its_segment_and_moves_it_to_the_tail(repo, smol_tokenizer):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    before = ws.build().segments
    old = next(i for i, s in enumerate(before) if s.key == "pkg/util.py")
    first, after = ws.update("pkg/util.py", "def helper(x):\n    return x * 3\n")
    assert first == old
    assert after.segments[:old] == before[:old]
    assert [s.key for s in after.segments[old:-1]] == [s.key for s in before[old + 1:]]
    assert after.segments[old:-1] == before[old + 1:]
    tail = after.segments[-1]
    assert (tail.kind, tail.key, tail.reason) == ("hot", "pkg/util.py", "hot (edited)")
    assert "x * 3" in tail.text

    # A second edit of the same (hot) file touches only the last segment.
    first, again = ws.update(repo / "pkg/util.py", "def helper(x):\n    return x * 4\n")
    assert first == len(again.segments) - 1
    assert again.segments[:-1] == after.segments[:-1]

    # Same text: nothing changes.
    first, same = ws.update("pkg/util.py", "def helper(x):\n    return x * 4\n")
    assert first == len(same.segments) and same.segments == again.segments


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
    idx = next(i for i, s in enumerate(layout.segments) if s.key == "app.py")
    first, layout = ws.update("app.py", None)
    assert first == idx and "app.py" not in [s.key for s in layout.segments]
    first, same = ws.update("never/was.py", None)
    assert first == len(same.segments)
    first, skipped = ws.update("node_modules/x/y.js", "x\n")
    assert first == len(skipped.segments)
    assert ("node_modules/x/y.js", "vendored") in [(s.path, s.reason) for s in skipped.skipped]


def test_update_is_o_changed_file(repo, smol_tokenizer, monkeypatch):
    ws = Workspace(repo, smol_tokenizer, persist=False)
    ws.build()
    parsed: list[str] = []
    real = tags.extract
    monkeypatch.setattr(tags, "extract", lambda lang, text: parsed.append(lang) or real(lang, text))
    monkeypatch.setattr("context.workspace.list_paths", lambda root: pytest.fail("update rescanned"))
    misses = ws.tokens.misses
    ws.update("crate/src/parser.rs", "pub struct Parser2;\n")
    assert parsed == []  # tags are parsed on the next build, not in the update
    assert ws.tokens.misses == misses + 1
    monkeypatch.undo()
    monkeypatch.setattr(tags, "extract", lambda lang, text: parsed.append(lang) or real(lang, text))
    ws.build()
    assert parsed == ["rust"]  # only the changed file: the others hit the tag cache


@pytest.mark.parametrize("budget", [900, 1000, 1200])
def test_budget_is_never_exceeded_and_selection_is_stable(repo, smol_tokenizer, budget):
    ws = Workspace(repo, smol_tokenizer, persist=False, budget=budget)
    layout = ws.build()
    assert layout.tokens <= budget
    kinds = {s.kind for s in layout.segments}
    assert "map" in kinds
    whole = {s.key for s in layout.segments if s.kind == "file"}
    for n in range(5):  # small edits to files that are in
        path = sorted(whole)[n % len(whole)] if whole else "app.py"
        text = (repo / path).read_text() + f"# edit {n}\n"
        _, layout = ws.update(path, text)
        assert layout.tokens <= budget
        (repo / path).write_text(text)
    hot = {s.key for s in layout.segments if s.kind == "hot"}
    still = {s.key for s in layout.segments if s.kind == "file"}
    assert still <= whole
    evicted = whole - still - hot
    assert all(r.reason.startswith("omitted") for r in layout.rows if r.path in evicted)
    # Rebuild (hysteresis): the files that were in stay in.
    rebuilt = ws.build()
    assert rebuilt.tokens <= budget
    assert {s.key for s in rebuilt.segments if s.kind in ("file", "hot")} >= still


def test_hysteresis_keeps_selection_when_ranks_shift(repo, smol_tokenizer):
    budget = 1000
    ws = Workspace(repo, smol_tokenizer, persist=False, budget=budget)
    first = {s.key for s in ws.build().segments if s.kind == "file"}
    # Shift ranks a little: one more file references helper().
    (repo / "extra.py").write_text("from pkg.util import helper\nhelper(1)\n")
    ws._hot.clear()
    warm = {s.key for s in ws.build().segments if s.kind in ("file", "hot")}
    assert first <= warm


def test_budget_too_small_raises(repo, smol_tokenizer):
    with pytest.raises(BudgetError):
        Workspace(repo, smol_tokenizer, persist=False, budget=5).build()


def test_changed_on_disk_since_last_build_is_hot(repo, smol_tokenizer):
    Workspace(repo, smol_tokenizer).build()
    (repo / "pkg/util.py").write_text("def helper(x):\n    return 0\n")
    layout = Workspace(repo, smol_tokenizer).build()
    assert (layout.segments[-1].key, layout.segments[-1].reason) == ("pkg/util.py", "hot (changed on disk)")


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
