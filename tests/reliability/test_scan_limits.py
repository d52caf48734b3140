"""The scan survives folder trees that break naive code: deeper than Python's recursion limit,
longer than PATH_MAX, and folders the user cannot open (in git mode and in walk mode).

`codectx context` runs as its own process (the CLI a user runs); the deep tree is also
served by the real language server. Unreadable folders need a user the permission bits
apply to: as root (containers, CI images) the CLI runs with every capability dropped,
so root's bypass of permission bits is gone, exactly as for an unprivileged user.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.lsp_session import ask, prompt_keys, served, show_context, skip_reasons, tiny_model
from tests.server.harness import REPO_ROOT, build_server_test_model, write_sample_workspace

DEPTH = 1500  # above Python's default recursion limit (1000)
BOTTOM = "bottom.py"


def make_deep(root: Path, name: str, depth: int = DEPTH) -> str:
    """`root/name/name/.../bottom.py`, made with paths relative to an open folder (full paths
    would pass PATH_MAX); returns the bottom file's root-relative path."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            child = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open(BOTTOM, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b"def bottom():\n    return 'deep'\n")
        os.close(out)
    finally:
        os.close(fd)
    return f"{name}/" * depth + BOTTOM


def remove_deep(root: Path, name: str) -> None:
    """Removes the tree from the top, one level at a time (shutil.rmtree recurses, and would fail)."""
    top, spare = root / name, root / f"{name}.next"
    while top.is_dir():
        for entry in os.listdir(top):
            if entry != name:
                os.unlink(top / entry)
        has_child = (top / name).is_dir()
        if has_child:
            os.rename(top / name, spare)
        os.rmdir(top)
        if not has_child:
            break
        os.rename(spare, top)


@pytest.fixture()
def deep(tmp_path):
    """A sample workspace with a folder tree `DEPTH` levels deep; removed afterwards."""
    made: list[str] = []

    def build(name: str) -> tuple[Path, str]:
        made.append(name)
        return tmp_path, make_deep(tmp_path, name)

    write_sample_workspace(tmp_path)
    yield build
    for name in made:
        remove_deep(tmp_path, name)


# Run as a program before the CLI: empties the capability bounding set (so the exec'd CLI, uid 0,
# gets no capability, and permission bits apply to it), checks CAP_DAC_OVERRIDE is gone, execs.
_WITHOUT_CAPABILITIES = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "for cap in range(64):\n"
    "    libc.prctl(24, cap, 0, 0, 0)\n"  # PR_CAPBSET_DROP; EINVAL past the last capability
    "if libc.prctl(23, 1, 0, 0, 0) != 0:\n"  # PR_CAPBSET_READ of CAP_DAC_OVERRIDE
    "    sys.exit('capabilities could not be dropped')\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")


def run_context(root: Path, unprivileged: bool = False) -> dict:
    """`codectx context --repo ROOT --json` with the tiny model's tokenizer; asserts exit status 0."""
    command = ["-m", "server.cli", "context", "--repo", str(root), "--json", "--tokenizer", str(tiny_model())]
    if unprivileged and os.geteuid() == 0:
        command = ["-c", _WITHOUT_CAPABILITIES, *command]
    done = subprocess.run([sys.executable, *command], cwd=REPO_ROOT, capture_output=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


def test_tree_deeper_than_the_recursion_limit_is_listed(deep):
    root, bottom = deep("d")  # 3,000-character paths: still under PATH_MAX, so the file is kept
    layout = run_context(root)
    assert {row["path"] for row in layout["files"]} == {"util.py", "main.py", bottom}
    assert layout["skipped"] == []


def test_tree_past_path_max_reports_where_the_os_refused(deep):
    root, bottom = deep("dd")  # 4,500-character paths: the OS refuses them (ENAMETOOLONG)
    layout = run_context(root)
    assert {row["path"] for row in layout["files"]} == {"util.py", "main.py"}
    [(folder, reason)] = [(row["path"], row["reason"]) for row in layout["skipped"]]
    assert bottom.startswith(folder) and reason == "unreadable folder (File name too long)"


async def test_language_server_on_a_hostile_tree_is_ready_and_answers(deep, tmp_path_factory):
    root, bottom = deep("d")
    (root / os.fsdecode(b"bad\xff.py")).write_bytes(b"X = 1\n")  # git allows any bytes in a name
    # The deep path is ~1,500 tokens, in the map and in the file's header: a model that reads 8,192 tokens
    # leaves the prefix room for it beside an ask.
    wide = build_server_test_model(tmp_path_factory.mktemp("wide-model"), max_position_embeddings=8192)
    model = {"name": str(wide), "kvBits": 16, "prefillChunk": 512}
    async with served(root, model=model) as client:
        context = await show_context(client)
        assert prompt_keys(context) == {"util.py", "main.py", bottom}
        assert skip_reasons(context) == {"bad\ufffd.py": "file name is not UTF-8"}
        await ask(client)


@pytest.mark.parametrize("mode", ["walk", "git"])
def test_file_names_that_are_not_utf8_are_reported_not_fatal(tmp_path, mode):
    """Such a name used to reach the tokenizer and stop the scan with a TypeError."""
    root = write_sample_workspace(tmp_path)
    (root / os.fsdecode(b"bad\xff.py")).write_bytes(b"X = 1\n")
    (root / os.fsdecode(b"dir\xfe")).mkdir()
    (root / os.fsdecode(b"dir\xfe") / "inner.py").write_bytes(b"Y = 1\n")
    (root / "new\nline.py").write_bytes(b"Z = 1\n")  # odd but UTF-8: kept
    if mode == "git":
        subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    layout = run_context(root)
    assert {row["path"] for row in layout["files"]} == {"util.py", "main.py", "new\nline.py"}
    skipped = {row["path"]: row["reason"] for row in layout["skipped"] if row["path"] != ".git/"}
    assert skipped == {"bad\ufffd.py": "file name is not UTF-8", "dir\ufffd/inner.py": "file name is not UTF-8"}


@pytest.mark.parametrize("mode", ["walk", "git"])
def test_unreadable_folder_and_file_are_reported(tmp_path, mode):
    root = write_sample_workspace(tmp_path)
    (root / "locked").mkdir()
    (root / "locked" / "inside.py").write_text("HIDDEN = 1\n", encoding="utf-8")
    (root / "sealed.py").write_text("SEALED = 1\n", encoding="utf-8")
    if mode == "git":
        subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    (root / "locked").chmod(0)
    (root / "sealed.py").chmod(0)
    try:
        layout = run_context(root, unprivileged=True)
    finally:
        (root / "locked").chmod(0o755)
    skipped = {row["path"]: row["reason"] for row in layout["skipped"]}
    assert skipped["locked/"] == "unreadable folder (Permission denied)"
    assert skipped["sealed.py"] == "unreadable (Permission denied)"
    assert {row["path"] for row in layout["files"]} == {"util.py", "main.py"}
    assert (".git/" in skipped) == (mode == "git")


IGNORE_FILES = {".gitignore": "*.log\n/out/\n!keep.log\nprivate/\n!*.md\n",
                "a/.gitignore": "secret_*\n/local.py\n", "a/b/.gitignore": "!secret_ok.py\n*.tmp\n"}
CANDIDATES = ["x.log", "keep.log", "out/gen.py", "out/keep.log", "private/notes.md", "notes.md",
              "a/out/gen.py", "a/secret_1.py", "a/b/secret_ok.py", "a/b/secret_2.py", "a/local.py",
              "a/b/local.py", "a/b/c/x.tmp", "a/b/c/y.py", "a/b/c/z.log", "a/b/keep.log"]


def test_single_path_ignore_rules_agree_with_git(tmp_path):
    """File events and tools judge one path at a time: the verdict must be git's, including a
    deeper "!" overriding a shallower pattern and nothing re-included inside an ignored folder."""
    from context.access import AccessPolicy

    subprocess.run(["git", "-C", str(tmp_path), "init", "-q"], check=True)
    for rel, text in IGNORE_FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    for rel in CANDIDATES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("X = 1\n", encoding="utf-8")
    found = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "--no-index", "--stdin", "-z"],
                           input="\0".join(CANDIDATES).encode(), capture_output=True, check=False).stdout
    by_git = {p for p in found.decode().split("\0") if p}
    assert {"out/keep.log", "private/notes.md", "a/b/secret_2.py"} <= by_git and "a/b/secret_ok.py" not in by_git
    policy = AccessPolicy(tmp_path)
    assert {p for p in CANDIDATES if policy.refusal(p) == "ignored"} == by_git
    assert {f.path for f in policy.scan().files} == set(CANDIDATES) - by_git | set(IGNORE_FILES)
    # The same verdicts from a workspace opened on a subfolder of the work tree.
    sub = AccessPolicy(tmp_path / "a")
    assert {p for p in CANDIDATES if p.startswith("a/") and sub.refusal(p[2:]) == "ignored"} == \
        {p for p in by_git if p.startswith("a/")}


@pytest.mark.parametrize("mode", ["walk", "git"])
def test_invalid_ignore_lines_are_left_out_as_git_does(tmp_path, mode):
    """A repository's .gitignore is untrusted: lines that are no valid pattern used to stop the scan."""
    root = write_sample_workspace(tmp_path)
    (root / ".gitignore").write_text("[z-a]\n\\\n!\n*.log\nprivate.py\n", encoding="utf-8")
    (root / "private.py").write_text("KEY = 1\n", encoding="utf-8")
    (root / "run.log").write_text("log\n", encoding="utf-8")
    if mode == "git":
        subprocess.run(["git", "-C", str(root), "init", "-q"], check=True)
    layout = run_context(root)
    assert {row["path"] for row in layout["files"]} == {"util.py", "main.py", ".gitignore"}
    skipped = {row["path"]: row["reason"] for row in layout["skipped"]}
    assert skipped["private.py"] == "ignored" and skipped["run.log"] == "ignored"
