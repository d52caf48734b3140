"""Opening an untrusted repository runs nothing its git configuration names.

A repository's `.git/config`, `.gitattributes` and `.git/hooks` can make git run programs:
an fsmonitor hook (even `git ls-files` runs it), hooks, clean/smudge/process filters,
textconv, external diff drivers, pagers, editors. Each mechanism below gets a script that
only creates its own marker file. For each one the test shows

* the positive control: plain `git` running a command that triggers the mechanism DOES
  create the marker (so the trap is armed, and the test could fail);
* `codectx context --repo` and the language server's scan (initialize, load, showContext,
  reindex, a file event, an ask) created no marker at all;
* `context.git.run_git` running the very command of the positive control creates none.
"""
from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from lsprotocol import types

from context.git import CONFIG_TIMEOUT_S
from tests.security.lsp_session import ask, file_event, prompt_keys, served, show_context, tiny_model
from tests.server.harness import REPO_ROOT, command

LS_FILES = ("ls-files", "-z", "-t", "--cached", "--others", "--exclude-standard")  # what the scan runs
OLD = 1_600_000_000  # committed files get an old mtime: git never re-reads them as "racily clean"


@dataclass(frozen=True)
class Trap:
    """A mechanism, the repository that holds it and the git command that triggers it."""

    repo: str
    args: tuple[str, ...]
    tty: bool = False
    dirty: tuple[str, ...] = ()  # files rewritten before the command (git compares their contents)
    missing: tuple[str, ...] = ()  # files deleted before the command (git checks them out again)


TRAPS = {
    "fsmonitor": Trap("config", LS_FILES),
    "hookspath": Trap("config", ("commit", "--allow-empty", "-q", "-m", "x")),
    "hooks": Trap("hooks", ("commit", "--allow-empty", "-q", "-m", "x")),
    "clean": Trap("config", ("diff",), dirty=("notes.txt",)),
    "clean_eq": Trap("config", ("diff", "--", "odd.eq"), dirty=("odd.eq",)),  # a "=" in the driver's name
    "include": Trap("hooks", LS_FILES),  # core.fsmonitor from an included file
    "smudge": Trap("config", ("checkout", "--", "notes.txt"), missing=("notes.txt",)),
    "process": Trap("config", ("checkout", "--", "proc.bin2"), missing=("proc.bin2",)),
    "textconv": Trap("config", ("log", "-p")),
    "external": Trap("config", ("diff", "--", "main.py"), dirty=("main.py",)),
    "command": Trap("config", ("diff", "--", "ext.cfg"), dirty=("ext.cfg",)),
    "editor": Trap("config", ("commit", "--allow-empty", "-q")),
    "pager": Trap("config", ("log",), tty=True),
    "pager_cmd": Trap("config", ("show", "--stat"), tty=True),
}


def _script(path: Path, marks: Path, name: str, then: str) -> str:
    path.write_text(f'#!/bin/sh\ntouch "{marks / name}"\n{then}\n', encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def _clean_env() -> dict[str, str]:
    """A user's shell without GIT_*/PAGER/EDITOR overrides that would hide a trap, and with an
    empty home and no system config (a global core.hooksPath would disarm a control)."""
    home = Path(os.environ["CODECTX_HOME"]) / "git-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") and k not in ("PAGER", "EDITOR", "VISUAL", "XDG_CONFIG_HOME")}
    return dict(env, TERM="xterm", HOME=str(home), GIT_CONFIG_NOSYSTEM="1")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=_clean_env())


def _build(base: Path, marks: Path) -> dict[str, Path]:
    """The "config" repository (every config mechanism, hooks via core.hooksPath) and the "hooks" one."""
    repos = {name: base / name for name in ("config", "hooks")}
    tools = base / "tools"
    tools.mkdir()
    for name, repo in repos.items():
        repo.mkdir()
        _git(repo, "init", "-q")
        _git(repo, "config", "user.name", "codectx tests")
        _git(repo, "config", "user.email", "tests@codectx.invalid")
        files = {"main.py": "print('hi')\n", "notes.txt": "plain\n", "data.dat": "one\n", "ext.cfg": "a\n",
                 "proc.bin2": "p\n", "odd.eq": "e\n",
                 ".gitattributes": "*.txt filter=EviL\n*.bin2 filter=evilproc\n*.dat diff=evil\n"
                                   "*.cfg diff=ext\n*.eq filter=a=b\n"}
        for rel, text in files.items():
            (repo / rel).write_text(text, encoding="utf-8")
            os.utime(repo / rel, (OLD, OLD))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "init")
        (repo / "data.dat").write_text("two\n", encoding="utf-8")  # a change for log -p / textconv
        _git(repo, "commit", "-q", "-am", "two")
    config = {
        "core.fsmonitor": _script(tools / "fsmonitor", marks, "fsmonitor", "exit 1"),
        "filter.EviL.clean": _script(tools / "clean", marks, "clean", "cat"),  # subsections keep their case
        "filter.EviL.smudge": _script(tools / "smudge", marks, "smudge", "cat"),
        "filter.a=b.clean": _script(tools / "clean_eq", marks, "clean_eq", "cat"),
        "filter.evilproc.process": _script(tools / "process", marks, "process", "exit 1"),
        "diff.evil.textconv": _script(tools / "textconv", marks, "textconv", 'cat "$1"'),
        "diff.external": _script(tools / "external", marks, "external", "exit 0"),
        "diff.ext.command": _script(tools / "command", marks, "command", "exit 0"),
        "core.editor": _script(tools / "editor", marks, "editor", 'echo message > "$1"'),
        "core.pager": _script(tools / "pager", marks, "pager", "cat"),
        "pager.show": _script(tools / "pager_cmd", marks, "pager_cmd", "cat"),
    }
    hooks_path = base / "hookspath"
    hooks_path.mkdir()
    _script(hooks_path / "pre-commit", marks, "hookspath", "exit 0")
    config["core.hooksPath"] = str(hooks_path)
    for key, value in config.items():
        _git(repos["config"], "config", key, value)
    included = base / "included.cfg"
    included.write_text(f"[core]\n\tfsmonitor = {_script(tools / 'include', marks, 'include', 'exit 1')}\n",
                        encoding="utf-8")
    _git(repos["hooks"], "config", "include.path", str(included))
    hooks = repos["hooks"] / ".git" / "hooks"
    for hook in ("pre-commit", "post-checkout", "post-commit", "reference-transaction"):
        _script(hooks / hook, marks, "hooks", "exit 0")
    return repos


def _prepare(repo: Path, trap: Trap, marks: Path) -> None:
    for old in marks.iterdir():
        old.unlink()
    for rel in trap.dirty:
        (repo / rel).write_text(f"changed {rel}\n", encoding="utf-8")
    for rel in trap.missing:
        (repo / rel).unlink(missing_ok=True)


def _run_in_pty(argv: list[str], cwd: Path, timeout: float = 60) -> None:
    """Runs `argv` with a terminal as stdin/stdout/stderr (git pages only to a terminal)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=_clean_env(),
                               start_new_session=True)
    os.close(slave)
    try:
        while select.select([master], [], [], timeout)[0]:
            try:
                if not os.read(master, 1 << 16):
                    break
            except OSError:  # EIO: the terminal's other side closed
                break
        process.wait(timeout=timeout)
    finally:
        os.close(master)


def _plain_git(repo: Path, trap: Trap) -> None:
    if trap.tty:
        _run_in_pty(["git", *trap.args], repo)
    else:
        subprocess.run(["git", "-C", str(repo), *trap.args], capture_output=True, env=_clean_env(), timeout=60,
                       stdin=subprocess.DEVNULL)


def _codectx_run_git(repo: Path, trap: Trap) -> None:
    """`context.git.run_git(repo, ARGS)` in a child process (with a terminal when the trap needs one)."""
    code = ("import sys; from pathlib import Path; from context.git import run_git; "
            "run_git(Path(sys.argv[1]), sys.argv[2:])")
    argv = [sys.executable, "-c", code, str(repo), *trap.args]
    if trap.tty:
        _run_in_pty(argv, REPO_ROOT)
    else:
        subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, env=_clean_env(), timeout=120)


@dataclass
class Armed:
    repos: dict[str, Path]
    marks: Path
    created: set[str] = field(default_factory=set)  # markers found after codectx's own runs
    listed: dict[str, set[str]] = field(default_factory=dict)  # repo -> files the CLI listed
    served: dict[str, set[str]] = field(default_factory=dict)  # repo -> files in the server's prefix


async def _serve(armed: Armed, name: str, repo: Path) -> None:
    async with served(repo) as client:
        armed.served[name] = prompt_keys(await show_context(client))
        await asyncio.wait_for(command(client, "codectx.reindex"), 60)
        (repo / "main.py").write_text("print('edited')\n", encoding="utf-8")
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=[
            file_event(repo / "main.py", types.FileChangeType.Changed),
            file_event(repo / ".gitattributes", types.FileChangeType.Changed)]))
        await show_context(client)
        await ask(client, "What does main.py print?")


@pytest.fixture(scope="module")
def armed(tmp_path_factory) -> Armed:
    """Both repositories, after codectx's CLI and language server have opened each of them."""
    base = tmp_path_factory.mktemp("armed")
    marks = base / "marks"
    marks.mkdir()
    armed = Armed(_build(base, marks), marks)
    model = tiny_model()
    for name, repo in armed.repos.items():
        for trap in TRAPS.values():  # every trap's state at once: dirty files, files to check out
            _prepare(repo, trap, marks)
        done = subprocess.run([sys.executable, "-m", "server.cli", "context", "--repo", str(repo), "--json",
                               "--tokenizer", str(model)], cwd=REPO_ROOT, capture_output=True, env=_clean_env(),
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr.decode()
        armed.listed[name] = {row["path"] for row in json.loads(done.stdout)["files"]}
        armed.created |= {m.name for m in marks.iterdir()}
        asyncio.run(_serve(armed, name, repo))
        armed.created |= {m.name for m in marks.iterdir()}
    return armed


def test_codectx_lists_and_serves_the_armed_repositories(armed):
    for name in armed.repos:
        assert {"main.py", "data.dat", "ext.cfg", ".gitattributes"} <= armed.listed[name]
        assert "main.py" in armed.served[name]


@pytest.mark.parametrize("mechanism", sorted(TRAPS))
def test_nothing_the_repository_configures_runs(armed, mechanism):
    trap = TRAPS[mechanism]
    repo = armed.repos[trap.repo]
    assert mechanism not in armed.created, f"codectx ran the repository's {mechanism} program"

    _prepare(repo, trap, armed.marks)
    _codectx_run_git(repo, trap)
    assert not sorted(m.name for m in armed.marks.iterdir()), f"run_git {' '.join(trap.args)}"

    _prepare(repo, trap, armed.marks)
    _plain_git(repo, trap)
    assert (armed.marks / mechanism).exists(), f"positive control: plain git {' '.join(trap.args)} is not armed"


def test_a_configuration_git_cannot_read_means_no_git_and_no_hang(tmp_path):
    """An include that is a FIFO blocks every git command forever: the scan walks the folder instead."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "main.py").write_text("print('hi')\n", encoding="utf-8")
    (root / ".gitignore").write_text("private.py\n", encoding="utf-8")
    (root / "private.py").write_text("KEY = 1\n", encoding="utf-8")
    _git(root, "init", "-q")
    os.mkfifo(root / ".git" / "evil.cfg")
    _git(root, "config", "include.path", "evil.cfg")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "server.cli", "context", "--repo", str(root), "--json",
                           "--tokenizer", str(tiny_model())], cwd=REPO_ROOT, capture_output=True, env=_clean_env(),
                          timeout=120, check=False)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr.decode()
    layout = json.loads(done.stdout)
    assert {row["path"] for row in layout["files"]} == {"main.py", ".gitignore"}
    skipped = {row["path"]: row["reason"] for row in layout["skipped"]}
    assert skipped == {".git/": "git metadata (never read)", "private.py": "ignored"}
    assert elapsed < CONFIG_TIMEOUT_S + 20  # one bounded wait, not one per git command
