"""Which paths of a workspace are candidates, and which folders were left out while listing.

In a git work tree the candidates come from `git ls-files` (tracked, plus untracked
files that are not ignored), run through `context.git.run_git` so nothing the
repository configures runs. Elsewhere an iterative walk (any depth: no recursion)
applies the same ignore rules. Either way every folder or file left out at this
stage is reported with its reason; the access policy decides about each candidate.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from context.git import GitError, run_git
from context.ignore import IgnoreRules

log = logging.getLogger(__name__)

GIT_METADATA = ".git"
_UNREADABLE = re.compile(r"warning: could not open directory '(?P<path>.+)': (?P<why>.+)$")
METADATA_REASON = "git metadata (never read)"


@dataclass(frozen=True)
class GitTree:
    """Where `root` sits in a git repository."""

    top: Path
    git_dir: Path


@dataclass
class Listing:
    """Candidate files (root-relative POSIX paths, sorted), what was left out, and how they were found.

    Attributes:
        paths: Candidate files.
        skipped: (path, reason) of folders and files left out while listing; folders end in "/".
        tracked: Files git tracks (they stay candidates even when an ignore rule matches them).
        git: True when git listed the files.
    """

    paths: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    tracked: frozenset[str] = frozenset()
    git: bool = False


def git_tree(root: Path) -> GitTree | None:
    """The git work tree `root` belongs to, or None (no git, not a work tree, or `root` is ignored there)."""
    try:
        out = run_git(root, ["rev-parse", "--show-toplevel", "--absolute-git-dir"], timeout=30)
        top, git_dir = out.decode("utf-8", "surrogateescape").splitlines()[:2]
    except (GitError, ValueError):
        return None
    if Path(top).resolve() != root:
        try:  # a folder ignored inside someone else's work tree (a venv, say): git lists nothing
            run_git(root, ["check-ignore", "-q", "."], timeout=30)
            return None
        except GitError:
            pass
    return GitTree(Path(top).resolve(), Path(git_dir))


def _split(raw: bytes) -> list[str]:
    return [p for p in raw.decode("utf-8", "surrogateescape").split("\0") if p]


def list_git(root: Path) -> Listing:
    """Candidates from git; ignored files and folders are reported (folders collapsed).

    Raises:
        GitError: git failed (the caller walks instead).
    """
    warnings: list[str] = []
    tagged = _split(run_git(root, ["ls-files", "-z", "-t", "--cached", "--others", "--exclude-standard"],
                            warnings=warnings))
    tracked = {entry[2:] for entry in tagged if not entry.startswith("? ")}
    paths = sorted({entry[2:] for entry in tagged})
    ignored = _split(run_git(root, ["ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                                    "--directory", "--no-empty-directory"]))
    skipped = [(p, "ignored") for p in sorted(ignored)]
    for line in warnings:  # git skips a folder it cannot open with a warning, not an error
        if (found := _UNREADABLE.match(line)) is not None:
            skipped.append((found["path"], f"unreadable folder ({found['why']})"))
    if (root / GIT_METADATA).exists():
        skipped.insert(0, (GIT_METADATA + "/", METADATA_REASON))
    return Listing(paths, skipped, frozenset(tracked), git=True)


def walk(root: Path, ignore: IgnoreRules, vendored: frozenset[str]) -> Listing:
    """Every file under `root` that no ignore rule matches, without following folder links.

    An explicit stack instead of recursion: a folder tree of any depth is listed (or
    reported as unreadable where the OS refuses a path), never a RecursionError.
    """
    listing = Listing()
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as entries:
                found = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in entries)
        except OSError as err:
            listing.skipped.append((rel_dir + "/", f"unreadable folder ({err.strerror or err})"))
            continue
        prefix = rel_dir + "/" if rel_dir else ""
        for name, is_dir, is_link in found:
            rel = prefix + name
            if is_dir:
                reason = _folder_reason(name, rel, ignore, vendored)
                if reason:
                    listing.skipped.append((rel + "/", reason))
                else:
                    stack.append(rel)
            elif is_link and os.path.isdir(root / rel):
                listing.skipped.append((rel + "/", "symlinked folder (not followed)"))
            elif ignore.ignored(rel):
                listing.skipped.append((rel, "ignored"))
            else:
                listing.paths.append(rel)
    listing.paths.sort()
    listing.skipped.sort()
    return listing


def _folder_reason(name: str, rel: str, ignore: IgnoreRules, vendored: frozenset[str]) -> str | None:
    if name == GIT_METADATA:
        return METADATA_REASON
    if ignore.ignored(rel, is_dir=True):
        return "ignored"
    if name in vendored:
        return "vendored"
    return None
