"""Whether a folder's volume matches names in any letter case (macOS's and Windows' default volumes do).

There `.ENV` opens `.env` and `.GIT/config` opens `.git/config`, so the access policy must refuse a secret's
name and git's metadata in any case; on a case-sensitive volume `Credentials/` is an ordinary folder and
must not be refused for looking like the `credentials` file. Asked of the volume itself, not the platform's
name: an entry of the folder (or a folder on its way) is looked up again with its letters' case swapped.
"""
from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

_PROBED_ENTRIES = 64


def ignores_case(root: Path) -> bool:
    """Whether `root`'s volume finds a name in any letter case; where no name with letters can be probed
    (an empty folder under a path without letters), the platform's default (macOS, Windows)."""
    for candidate in itertools.chain(_entries(root), _ancestors(root)):
        swapped = candidate.with_name(candidate.name.swapcase())
        try:
            return os.path.samefile(candidate, swapped)
        except OSError:  # the swapped name names nothing: a case-sensitive volume
            return False
    return sys.platform in ("darwin", "win32")


def _entries(root: Path) -> list[Path]:
    """Up to `_PROBED_ENTRIES` entries of `root` whose names change with their case."""
    try:
        with os.scandir(root) as found:
            names = [entry.name for entry in itertools.islice(found, _PROBED_ENTRIES)]
    except OSError:
        return []
    return [root / name for name in names if name.swapcase() != name]


def _ancestors(root: Path) -> list[Path]:
    """`root` and the folders above it whose names change with their case, nearest first."""
    return [p for p in (root, *root.parents) if p.name and p.name.swapcase() != p.name]
