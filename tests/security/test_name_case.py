"""The access policy's names of secrets and of git's metadata, and letter case. On macOS's and Windows'
default volumes `.ENV` opens `.env` and `.GIT/config` opens `.git/config`, so there a tool call (which text
in the repository can provoke) naming them so is refused as the lower-case name is. On a case-sensitive
volume (this machine's) such names are other files, and an ordinary `Credentials/` folder of a C# or Java
project must not be refused for looking like the `credentials` file. Which kind of volume the root is on is
asked of the volume itself (`context.volume_case`); no case-insensitive volume can be mounted here, so
the folding branch runs with the probe's answer set (`fold`)."""
from __future__ import annotations

import pytest

from context import access
from context.access import AccessPolicy
from context.volume_case import ignores_case

FOLDED = [
    (".ENV", "secret (deny list)"), (".Env.local", "secret (deny list)"), ("sub/PROD.ENV", "secret (deny list)"),
    ("ID_RSA", "secret (deny list)"), ("keys/Server.PEM", "secret (deny list)"), ("Credentials", "secret (deny list)"),
    (".NETRC", "secret (deny list)"), (".Git-Credentials", "secret (deny list)"), (".SSH/config", "secret (deny list)"),
    ("PRIVATE/notes.txt", "secret (deny list)"), ("db.SECRET", "secret (deny list)"),  # the setting's patterns
    (".GIT/config", "git metadata (never read)"), ("vendor/.Git/HEAD", "git metadata (never read)"),
]


def make_policy(root) -> AccessPolicy:
    (root / "app.py").write_text("x = 1\n", encoding="utf-8")
    return AccessPolicy(root, deny=["Private/", "*.Secret"])


@pytest.fixture
def fold(monkeypatch):
    monkeypatch.setattr(access, "ignores_case", lambda root: True)


def test_this_machines_volume_is_probed_as_case_sensitive(tmp_path):
    (tmp_path / "Readme.md").write_text("x\n", encoding="utf-8")
    assert ignores_case(tmp_path) is False and make_policy(tmp_path).folds_case is False


@pytest.mark.parametrize("name, reason", FOLDED)
def test_on_a_volume_that_ignores_case_secret_and_metadata_names_are_refused_in_any_case(fold, tmp_path, name,
                                                                                        reason):
    policy = make_policy(tmp_path)
    assert policy.folds_case
    assert policy.refusal(name) == reason
    assert policy.edit_refusal(name) == reason  # nor is an edit proposed there


@pytest.mark.parametrize("name", [".ENV", "ID_RSA", "keys/Server.PEM", "Credentials", ".NETRC", ".SSH/config",
                                  ".GIT/config", "src/.Git/HEAD"])
def test_on_a_case_sensitive_volume_other_cases_are_other_files(tmp_path, name):
    policy = make_policy(tmp_path)
    assert policy.refusal(name.lower()) is not None  # the name itself is refused, as always
    assert policy.refusal(name) is None


def test_a_credentials_folder_of_a_project_is_read_on_a_case_sensitive_volume(tmp_path):
    policy = make_policy(tmp_path)
    assert policy.refusal("src/Auth/Credentials/CredentialStore.cs") is None
    assert policy.refusal("src/Auth/Credentials", is_dir=True) is None
    assert policy.refusal("src/auth/credentials", is_dir=True) == "secret (deny list)"


@pytest.mark.parametrize("name", ["Environment.py", "envelope.md", "src/credentials_form.py", "gitignore.txt",
                                  "app.py"])
def test_ordinary_names_that_look_alike_pass_either_way(fold, tmp_path, name):
    policy = make_policy(tmp_path)
    assert policy.refusal(name) is None and policy.edit_refusal(name) is None


def test_an_edit_outside_the_workspace_is_refused(tmp_path):
    policy = make_policy(tmp_path)
    assert "outside the workspace" in policy.edit_refusal(tmp_path.parent / "elsewhere.py")
    assert "outside the workspace" in policy.edit_refusal("../elsewhere.py")
