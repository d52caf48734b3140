"""Write-tests insertions with scripted model drafts (valid, colliding, invalid)."""
from __future__ import annotations

import ast
import os

import pytest

from context.errors import AccessDeniedError
from server.core.features import code_actions
from tests.server.harness import SAMPLE_UTIL
from tests.server.scripted import session_for

EXISTING = "from util import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"


def defined(text: str) -> list[str]:
    return [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]


async def test_a_valid_draft_with_new_names_is_kept(workspace):
    draft = "def test_add_negative():\n    assert add(-1, -2) == -3"
    session, _ = session_for(workspace, [draft])
    (workspace / "tests").mkdir()
    (workspace / "tests" / "test_util.py").write_text(EXISTING, encoding="utf-8")
    insertion = await code_actions.tests_insertion(session, workspace, workspace / "util.py", SAMPLE_UTIL, 5)
    assert not insertion.create and insertion.line == EXISTING.count("\n")
    assert defined(EXISTING + insertion.text) == ["test_add", "test_add_negative"]


async def test_a_draft_reusing_a_test_name_becomes_a_placeholder(workspace):
    session, _ = session_for(workspace, ["def test_add():\n    assert add(2, 2) == 4"])
    (workspace / "tests").mkdir()
    (workspace / "tests" / "test_util.py").write_text(EXISTING, encoding="utf-8")
    insertion = await code_actions.tests_insertion(session, workspace, workspace / "util.py", SAMPLE_UTIL, 5)
    extended = EXISTING + insertion.text
    assert defined(extended) == ["test_add", "test_add_2"]
    assert "assert add(2, 2) == 4" in extended  # the draft is kept as comments


async def test_a_new_test_file_imports_the_function(workspace):
    session, _ = session_for(workspace, ["not python at all ("])
    insertion = await code_actions.tests_insertion(session, workspace, workspace / "util.py", SAMPLE_UTIL, 9)
    assert insertion.create and insertion.path == workspace / "tests" / "test_util.py"
    assert insertion.text.startswith("from util import greet\n")
    assert defined(insertion.text) == ["test_greet"]


async def test_no_test_file_is_proposed_through_a_link_that_leads_out_of_the_workspace(workspace, tmp_path_factory):
    """A repository's `tests` link to a folder outside would steer a model-written file there; the policy refuses
    it before the model is asked, and says why."""
    outside = tmp_path_factory.mktemp("outside")  # (the workspace is the test's tmp_path)
    os.symlink(outside, workspace / "tests")
    session, engine = session_for(workspace, ["def test_add():\n    assert add(1, 2) == 3"])
    with pytest.raises(AccessDeniedError, match="tests/test_util.py: symlink outside workspace"):
        await code_actions.tests_insertion(session, workspace, workspace / "util.py", SAMPLE_UTIL, 5)
    assert engine.requests == [] and list(outside.iterdir()) == []


async def test_no_test_is_appended_to_a_file_the_policy_refuses(workspace, tmp_path_factory):
    (workspace / "tests").mkdir()
    secret = tmp_path_factory.mktemp("outside") / "elsewhere.py"
    secret.write_text(EXISTING, encoding="utf-8")
    os.symlink(secret, workspace / "tests" / "test_util.py")
    session, engine = session_for(workspace, ["def test_add_2():\n    assert add(2, 2) == 4"])
    with pytest.raises(AccessDeniedError, match="symlink outside workspace"):
        await code_actions.tests_insertion(session, workspace, workspace / "util.py", SAMPLE_UTIL, 5)
    assert engine.requests == [] and secret.read_text(encoding="utf-8") == EXISTING
