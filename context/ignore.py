"""git's ignore rules for single paths: `.gitignore` / `.ignore` at every level,
`.git/info/exclude` and the user's global excludes file.

The scan lists a git work tree with `git ls-files`, which applies these rules itself;
`IgnoreRules` answers the same question for one path at a time (a file event, an
editor buffer, a tool call) and for walks outside git.
"""
from __future__ import annotations

import logging
import os
import stat
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
    lines = text.splitlines() if text else []
    return pathspec.GitIgnoreSpec.from_lines(lines) if lines else None


class IgnoreRules:
    """Ignore rules of a folder tree.

    Args:
        root: The workspace root.
        top: The git work tree's top when `root` is inside one (rules above `root` and the
            repository's `info/exclude` apply then), else None.
        git_dir: The repository's git directory (for `info/exclude`), when known.
    """

    def __init__(self, root: Path, top: Path | None = None, git_dir: Path | None = None) -> None:
        self.root = root
        self.top = top if top is not None else root
        rel = os.path.relpath(root, self.top).replace(os.sep, "/")
        self._prefix = "" if rel == "." else rel + "/"
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}
        repo_wide = [read_small_file(git_dir / "info" / "exclude") if git_dir is not None else None]
        if (excludes := global_excludes_file()) is not None:
            repo_wide.append(read_small_file(excludes))
        self._repo_wide = [s for s in map(_spec, repo_wide) if s is not None]

    def _dir_spec(self, rel_dir: str) -> pathspec.GitIgnoreSpec | None:
        if rel_dir not in self._specs:
            folder = self.top / rel_dir if rel_dir else self.top
            text = "\n".join(t for t in (read_small_file(folder / n) for n in IGNORE_FILES) if t)
            self._specs[rel_dir] = _spec(text)
        return self._specs[rel_dir]

    def forget(self, rel: str) -> None:
        """Drops the cached rules of `rel`'s folder (its ignore file changed)."""
        parent = (self._prefix + rel).rpartition("/")[0]
        self._specs.pop(parent, None)

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether a root-relative path is ignored by any ignore file above it (or repository-wide)."""
        full = self._prefix + rel
        suffix = "/" if is_dir else ""
        if any(spec.match_file(full + suffix) for spec in self._repo_wide):
            return True
        parts = full.split("/")
        for i in range(len(parts)):
            spec = self._dir_spec("/".join(parts[:i]))
            if spec is not None and spec.match_file("/".join(parts[i:]) + suffix):
                return True
        return False


def is_ignore_file(rel: str) -> bool:
    """True for `.gitignore` / `.ignore` (a change to one changes what is ignored)."""
    return rel.rpartition("/")[2] in IGNORE_FILES
