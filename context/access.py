"""`AccessPolicy`: the one gate every read of a workspace file goes through.

The scan, file events, editor buffers, the model's tools, hover's definition index
and code actions all ask the same policy. A path is refused when it is outside the
root (also through a symlink anywhere on its way), inside `.git/`, on the secrets
deny list, ignored by git's rules (unless git tracks it), or left out by the scan's
rules (vendored, lockfile, binary, generated, include/exclude globs). Reading opens
the resolved path without following a final link and without blocking, checks that
the opened file is a regular file inside the root, and caps the read before reading.
"""
from __future__ import annotations

import logging
import os
import re
import stat
import sys
from pathlib import Path
from typing import Sequence

import pathspec

from context.errors import AccessDeniedError, WorkspaceError
from context.ignore import IgnoreRules, is_ignore_file
from context.listing import GIT_METADATA, METADATA_REASON, Listing, git_tree, list_git, walk
from context.git import GitError
from context.scan import VENDORED_DIRS, ScanResult, ScanRules, Skipped, SourceFile, decode, minified
from context.volume_case import ignores_case

log = logging.getLogger(__name__)

DEFAULT_DENY = (
    ".env", ".env.*", "*.env", ".envrc",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx", "*.asc", "*.gpg",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.ppk",
    ".ssh/", ".gnupg/", ".aws/", ".azure/", ".kube/", ".docker/config.json",
    ".netrc", "_netrc", ".npmrc", ".pypirc", ".git-credentials", ".htpasswd",
    "credentials", "credentials.json", "*.tfstate", "*.tfstate.*", "secrets.yaml", "secrets.yml",
)
"""Secret files no path reaches (gitignore syntax). `context.deny` (a setting) adds patterns."""

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_KIND = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device",
         stat.S_IFDIR: "a folder"}


class AccessPolicy:
    """Which files of a workspace may be read, and reading them safely.

    Args:
        root: The workspace folder.
        rules: The scan's rules (include/exclude globs, size cap).
        deny: Extra secret patterns (gitignore syntax) on top of `DEFAULT_DENY`.

    Raises:
        WorkspaceError: A `deny` pattern is not a valid pattern.
    """

    def __init__(self, root: str | Path, rules: ScanRules = ScanRules(), deny: Sequence[str] = ()) -> None:
        self.root = Path(root).resolve()
        self.given_root = Path(os.path.abspath(root))
        """The root as the caller named it: an editor that opened the workspace through a
        symlinked folder sends paths under it (`relative` accepts both)."""
        self.rules = rules
        self.deny = tuple(DEFAULT_DENY) + tuple(deny)
        self.folds_case = ignores_case(self.root)
        """Whether the root's volume opens a name in any letter case: then secrets' names and git's metadata are
        matched in any case (`.ENV` opens `.env` there; here `Credentials/` may be an ordinary folder)."""
        try:
            self._deny = pathspec.GitIgnoreSpec.from_lines(self.deny)
            self._deny_folded = pathspec.GitIgnoreSpec.from_lines(p.lower() for p in self.deny)
        except (ValueError, re.error) as err:  # a deny pattern that cannot work must not fail open
            raise WorkspaceError(f"invalid deny pattern in {list(deny)!r}: {err}") from err
        self.tree = git_tree(self.root)
        self.ignore = IgnoreRules(self.root, *(self.tree.top, self.tree.git_dir) if self.tree else ())
        self._tracked: frozenset[str] = frozenset()

    # ----- names ------------------------------------------------------------------------------

    def relative(self, path: str | Path) -> str:
        """`path` (absolute, or relative to the root) as a root-relative POSIX path.

        Lexical only: `..` may not climb out, links are judged when reading. An absolute
        path may name the root as resolved or as given (both are the same folder).

        Raises:
            AccessDeniedError: The path is outside the workspace or not a usable name.
        """
        text = os.fspath(path)
        if "\0" in text or not text.strip():
            raise AccessDeniedError(f"{quoted_name(text)} is not a file name")
        try:
            os.fsencode(text)
        except UnicodeEncodeError as err:  # a lone surrogate from JSON: no file can have this name
            raise AccessDeniedError(f"{quoted_name(text)} is not a file name") from err
        for root in dict.fromkeys((self.root, self.given_root)):
            rel = os.path.relpath(os.path.normpath(os.path.join(root, text)), root)
            if not (rel in (".", "..") or rel.startswith(".." + os.sep) or os.path.isabs(rel)):
                return rel.replace(os.sep, "/")
        raise AccessDeniedError(f"{quoted_name(text)} is outside the workspace {self.root}")

    def refusal(self, rel: str, is_dir: bool = False) -> str | None:
        """Why a root-relative path may not be read, judged by its name alone; None if it may."""
        if not _is_utf8(rel):  # git and the walk give such names surrogate-escaped; no tokenizer takes them
            return "file name is not UTF-8"
        reason = self._protected(rel, is_dir)
        if reason is not None:
            return reason
        if rel not in self._tracked and self.ignore.ignored(rel, is_dir):
            return "ignored"
        return self.rules.path_reason(rel)

    def edit_refusal(self, path: str | Path) -> str | None:
        """Why an edit codectx proposes to the editor (a file to create or change) may not name `path`:
        outside the workspace, in git's metadata, a secret's name, or a way through a link that leads out of
        the workspace or to such a name; None when it may. (Ignore rules and the scan's globs do not bind:
        a new test file may be one the scan leaves out.) The editor writes; codectx only proposes."""
        try:
            rel = self.relative(path)
        except AccessDeniedError as err:
            return str(err)
        return self._protected(rel) or self._link_refusal(rel)

    def _protected(self, rel: str, is_dir: bool = False) -> str | None:
        """Git's metadata or a secret's name; in any letter case where the volume opens names so (`folds_case`)."""
        if GIT_METADATA in (rel.lower() if self.folds_case else rel).split("/"):
            return METADATA_REASON
        name = rel + ("/" if is_dir else "")
        if self._deny.match_file(name) or self.folds_case and self._deny_folded.match_file(name.lower()):
            return "secret (deny list)"
        return None

    # ----- reading ----------------------------------------------------------------------------

    def read(self, path: str | Path) -> SourceFile | Skipped:
        """The file's text, or why it is not read. Never raises for a bad file."""
        rel = self._allowed(path)
        if isinstance(rel, Skipped):
            return rel
        item = self._read_bytes(rel)
        return item if isinstance(item, Skipped) else self._text(rel, item)

    def admit(self, path: str | Path, text: str) -> SourceFile | Skipped:
        """Applies the policy to an editor buffer's text (no disk read of the contents)."""
        rel = self._allowed(path)
        return rel if isinstance(rel, Skipped) else self._text(rel, text.encode("utf-8", "surrogatepass"))

    def _allowed(self, path: str | Path) -> str | Skipped:
        """`path` as a root-relative path the policy lets through (by name and link target), or why not."""
        try:
            rel = self.relative(path)
        except AccessDeniedError as err:
            return Skipped(os.fspath(path), str(err))
        reason = self.refusal(rel) or self._link_refusal(rel)
        return Skipped(printable(rel), reason) if reason else rel

    def read_text(self, path: str | Path) -> str:
        """The file's text for a caller that needs it now (tools, hover, code actions).

        Raises:
            AccessDeniedError: With the reason the policy gives.
        """
        item = self.read(path)
        if isinstance(item, Skipped):
            raise AccessDeniedError(f"{quoted_name(item.path)}: {item.reason}")
        return item.text

    def _text(self, rel: str, data: bytes) -> SourceFile | Skipped:
        item = decode(rel, data, self.rules)
        if isinstance(item, SourceFile) and minified(item.text):
            return Skipped(rel, "minified")
        return item

    def _link_refusal(self, rel: str) -> str | None:
        """Why a path whose way passes through a link may not be read (judged on the target)."""
        lexical = os.path.join(self.root, rel)
        try:
            real = os.path.realpath(lexical)
        except OSError as err:  # a link it may not read (/proc/1/cwd under a root of /)
            return f"unreadable ({err.strerror or err})"
        if real == lexical:
            return None
        if not _inside(real, self.root):
            return "symlink outside workspace"
        target = os.path.relpath(real, self.root).replace(os.sep, "/")
        reason = self.refusal(target)
        return f"symlink to {target}: {reason}" if reason else None

    def _read_bytes(self, rel: str) -> bytes | Skipped:
        try:
            real = os.path.realpath(os.path.join(self.root, rel))
            fd = os.open(real, _OPEN_FLAGS)
        except FileNotFoundError:
            return Skipped(rel, "missing")
        except OSError as err:  # ELOOP (a link swapped in), EACCES, ENAMETOOLONG, ...
            return Skipped(rel, f"unreadable ({err.strerror or err})")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return Skipped(rel, f"not a regular file ({_KIND.get(stat.S_IFMT(st.st_mode), 'special')})")
            opened = _opened_path(fd)
            if opened is not None and not _inside(opened, self.root):
                return Skipped(rel, "symlink outside workspace")
            if st.st_size > self.rules.max_bytes:
                return Skipped(rel, f"too large ({st.st_size} bytes)")
            return _read_capped(fd, self.rules.max_bytes + 1)
        except OSError as err:
            return Skipped(rel, f"unreadable ({err.strerror or err})")
        finally:
            os.close(fd)

    # ----- listing ----------------------------------------------------------------------------

    def listing(self) -> Listing:
        """Candidate files and what was left out while listing (git, else an iterative walk)."""
        listing = None
        if self.tree is not None:
            try:
                listing = list_git(self.root)
            except GitError as err:
                log.warning("git could not list %s (%s); walking the folder instead", self.root, err)
        if listing is None:
            listing = walk(self.root, self.ignore, VENDORED_DIRS)
        self._tracked = listing.tracked
        return listing

    def scan(self, paths: Sequence[str] | None = None) -> ScanResult:
        """Reads every candidate file (or the given root-relative paths) through the policy.

        Returns:
            Kept files sorted by path; every file or folder left out, with its reason.
        """
        result = ScanResult()
        if paths is None:
            listing = self.listing()
            paths = listing.paths
            result.skipped.extend(Skipped(printable(p), reason) for p, reason in listing.skipped)
        for rel in sorted(set(paths)):
            item = self.read(rel)
            (result.files if isinstance(item, SourceFile) else result.skipped).append(item)
        result.skipped.sort(key=lambda s: s.path)
        log.debug("scanned %s: %d kept, %d skipped", self.root, len(result.files), len(result.skipped))
        return result

    def changed(self, rel: str) -> None:
        """Tells the policy that `rel` changed on disk (an ignore file's rules are re-read)."""
        if is_ignore_file(rel):
            self.ignore.forget(rel)


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable(name: str) -> str:
    """`name` with the bytes of a non-UTF-8 file name shown as U+FFFD (for reports and JSON)."""
    return name if _is_utf8(name) else name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def quoted_name(name: str, limit: int = 120) -> str:
    """`name` quoted for a message, shortened: a message never carries a megabyte-long name."""
    return repr(name) if len(name) <= limit else repr(name[:limit]) + f"... ({len(name)} characters)"


def _inside(path: str, root: Path) -> bool:
    root_text = str(root)
    return path == root_text or path.startswith(root_text.rstrip(os.sep) + os.sep)


def _opened_path(fd: int) -> str | None:
    """The path the kernel says `fd` is open on (Linux /proc, macOS F_GETPATH), or None."""
    if sys.platform.startswith("linux"):
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
    if sys.platform == "darwin":
        import fcntl

        try:
            return fcntl.fcntl(fd, 50, b"\0" * 1024).rstrip(b"\0").decode("utf-8", "surrogateescape")  # F_GETPATH
        except OSError:
            return None
    return None


def _read_capped(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
