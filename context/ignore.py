"""git's ignore rules for single paths: `.gitignore` / `.ignore` at every level,
`.git/info/exclude` and the user's global excludes file.

The scan lists a git work tree with `git ls-files`, which applies these rules itself;
`IgnoreRules` answers the same question for one path at a time (a file event, an
editor buffer, a tool call) and for walks outside git.
"""
from __future__ import annotations

import logging
import os
import re
import stat
import threading
from functools import lru_cache
from pathlib import Path

import pathspec

from context.git import GitError, git_plain

log = logging.getLogger(__name__)

IGNORE_FILES = (".gitignore", ".ignore")
MAX_IGNORE_FILE_BYTES = 1 << 20


def read_small_file(path: Path, limit: int = MAX_IGNORE_FILE_BYTES) -> str | None:
    """A regular file's text (at most `limit` bytes), or None.

    Never blocks on a FIFO and never follows a final symlink: an ignore file that is
    a link or a device is not read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


@lru_cache(maxsize=1)
def global_excludes_file() -> Path | None:
    """The user's global excludes file: `core.excludesFile` of the global config, else git's default."""
    try:
        out = git_plain(Path.home(), ["config", "--global", "--get", "core.excludesFile"], timeout=10)
        value = out.decode("utf-8", "replace").strip()
    except GitError:
        value = ""
    if value:
        return Path(os.path.expanduser(value))
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(config_home) / "git" / "ignore"


def _spec(text: str | None) -> pathspec.GitIgnoreSpec | None:
    """An ignore file's rules. Lines that are not valid patterns are left out, as git leaves
    them out: a repository's ignore file is untrusted input and must not stop the scan."""
    lines = text.splitlines() if text else []
    if not lines:
        return None
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, re.error):
        kept = [line for line in lines if _compiles(line)]
        log.info("ignore rules: left out %d line(s) that are not valid patterns", len(lines) - len(kept))
        return pathspec.GitIgnoreSpec.from_lines(kept) if kept else None


def _compiles(line: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except (ValueError, re.error):
        return False
    return True


class IgnoreRules:
    """Ignore rules of a folder tree.

    Args:
        root: The workspace root.
        top: The git work tree's top when `root` is inside one (rules above `root` and the
            repository's `info/exclude` apply then), else None.
        git_dir: The repository's git directory (for `info/exclude`), when known.

    Its caches fill as paths are asked about, from the threads that read workspace files (the server builds
    prompts and runs tools off its event loop): one lock around each question and each `forget`.
    """

    def __init__(self, root: Path, top: Path | None = None, git_dir: Path | None = None) -> None:
        self._lock = threading.RLock()
        self.root = root
        self.top = top if top is not None else root
        rel = os.path.relpath(root, self.top).replace(os.sep, "/")
        self._prefix = "" if rel == "." else rel + "/"
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}
        # folder -> (offset into a top-relative path, spec) of every ignore file that applies
        # inside it: a deep path costs one lookup, not one per level.
        self._chains: dict[str, tuple[tuple[int, pathspec.GitIgnoreSpec], ...]] = {}
        self._folders: dict[str, bool] = {}  # top-relative folder -> ignored (itself or by a parent)
        repo_wide = [read_small_file(git_dir / "info" / "exclude") if git_dir is not None else None]
        if (excludes := global_excludes_file()) is not None:
            repo_wide.append(read_small_file(excludes))
        self._repo_wide = [s for s in map(_spec, repo_wide) if s is not None]

    def _dir_spec(self, rel_dir: str) -> pathspec.GitIgnoreSpec | None:
        if rel_dir not in self._specs:
            folder = os.path.join(self.top, rel_dir) if rel_dir else str(self.top)
            text = "\n".join(t for t in (read_small_file(os.path.join(folder, n)) for n in IGNORE_FILES) if t)
            self._specs[rel_dir] = _spec(text)
        return self._specs[rel_dir]

    def _chain(self, folder: str) -> tuple[tuple[int, pathspec.GitIgnoreSpec], ...]:
        """The specs of `folder` and every folder above it (top-relative), outermost first."""
        todo = []
        while folder not in self._chains:  # a loop, not recursion: folders nest to any depth
            todo.append(folder)
            if not folder:
                break
            folder = folder.rpartition("/")[0]
        chain = self._chains.get(folder, ())
        for name in reversed(todo):
            spec = self._dir_spec(name)
            if spec is not None:
                chain = (*chain, (len(name) + 1 if name else 0, spec))
            self._chains[name] = chain
        return chain

    def _decide(self, full: str, is_dir: bool) -> bool:
        """git's verdict on one top-relative path, its folders aside: the deepest ignore file
        with a matching pattern decides (its last match: ignore, or re-include with "!"),
        then `info/exclude`, then the global excludes file."""
        suffix = "/" if is_dir else ""
        for offset, spec in reversed(self._chain(full.rpartition("/")[0])):
            verdict = spec.check_file(full[offset:] + suffix).include
            if verdict is not None:
                return verdict
        for spec in self._repo_wide:
            verdict = spec.check_file(full + suffix).include
            if verdict is not None:
                return verdict
        return False

    def _folder_ignored(self, folder: str) -> bool:
        """Whether a top-relative folder is ignored, itself or through a folder above it."""
        todo = []
        while folder and folder not in self._folders:
            todo.append(folder)
            folder = folder.rpartition("/")[0]
        verdict = self._folders.get(folder, False)
        for name in reversed(todo):
            verdict = verdict or self._decide(name, is_dir=True)
            self._folders[name] = verdict
        return verdict

    def forget(self, rel: str) -> None:
        """Drops the cached rules of `rel`'s folder (its ignore file changed)."""
        parent = (self._prefix + rel).rpartition("/")[0]
        with self._lock:
            self._specs.pop(parent, None)
            self._chains.clear()
            self._folders.clear()

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether git would ignore a root-relative path. As in git, nothing inside an ignored
        folder can be re-included, and a deeper ignore file overrides a shallower one."""
        full = self._prefix + rel
        with self._lock:
            return self._folder_ignored(full.rpartition("/")[0]) or self._decide(full, is_dir)


def is_ignore_file(rel: str) -> bool:
    """True for `.gitignore` / `.ignore` (a change to one changes what is ignored)."""
    return rel.rpartition("/")[2] in IGNORE_FILES
