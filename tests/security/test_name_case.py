"""The access policy's names of secrets and of git's metadata hold in any letter case: on macOS's and Windows'
default volumes `.ENV` opens `.env` and `.GIT/config` opens `.git/config`, so a tool call (which text in the
repository can provoke) naming them so must be refused as the lower-case name is. On a case-sensitive
volume, refusing such a name costs nothing."""
from __future__ import annotations

import pytest

from context.access import AccessPolicy


@pytest.fixture
def policy(tmp_path) -> AccessPolicy:
    (tmp_path / "app.py").write_text("x = 1\n", encoding="utf-8")
    return AccessPolicy(tmp_path, deny=["Private/", "*.Secret"])


@pytest.mark.parametrize("name, reason", [
    (".ENV", "secret (deny list)"), (".Env.local", "secret (deny list)"), ("sub/PROD.ENV", "secret (deny list)"),
    ("ID_RSA", "secret (deny list)"), ("keys/Server.PEM", "secret (deny list)"), ("Credentials", "secret (deny list)"),
    (".NETRC", "secret (deny list)"), (".Git-Credentials", "secret (deny list)"), (".SSH/config", "secret (deny list)"),
    ("private/notes.txt", "secret (deny list)"), ("PRIVATE/notes.txt", "secret (deny list)"),  # a setting's pattern
    ("db.secret", "secret (deny list)"), ("db.SECRET", "secret (deny list)"),
    (".GIT/config", "git metadata (never read)"), ("vendor/.Git/HEAD", "git metadata (never read)"),
])
def test_secret_and_metadata_names_are_refused_in_any_case(policy, name, reason):
    assert policy.refusal(name) == reason
    assert policy.edit_refusal(name) == reason  # nor is an edit proposed there


@pytest.mark.parametrize("name", ["Environment.py", "envelope.md", "src/credentials_form.py", "gitignore.txt",
                                  "app.py"])
def test_ordinary_names_that_look_alike_still_pass(policy, name):
    assert policy.refusal(name) is None and policy.edit_refusal(name) is None


def test_an_edit_outside_the_workspace_is_refused(policy, tmp_path):
    assert "outside the workspace" in policy.edit_refusal(tmp_path.parent / "elsewhere.py")
    assert "outside the workspace" in policy.edit_refusal("../elsewhere.py")
