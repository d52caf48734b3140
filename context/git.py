"""Running git on an untrusted repository without running anything the repository configures.

A repository's own configuration (`.git/config`, files it includes, `.gitattributes`)
can name programs that git runs on its behalf: an fsmonitor hook (run even by
`git ls-files`), hooks, clean/smudge filters, textconv and external diff drivers,
pagers, editors, credential helpers. `run_git` reads the configuration first and
overrides every key that names a program with a harmless value at command-line scope
(which has the last word over every config file): through `GIT_CONFIG_COUNT` /
`GIT_CONFIG_KEY_n` / `GIT_CONFIG_VALUE_n`, which take any key as it is, and also as `-c`
for keys without "=" (`-c` splits at the first "=", so `filter.a=b.clean` cannot be named
there; git before 2.31 only reads `-c`). It points `core.hooksPath` at nothing, never
pages, never takes optional locks and drops inherited `GIT_*` variables (which could
point git at another repository or program). A configuration it cannot read in
`CONFIG_TIMEOUT_S` (an include that is a FIFO blocks git forever) means no git at all.
"""
from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

log = logging.getLogger(__name__)

GIT_TIMEOUT_S = 120
CONFIG_TIMEOUT_S = 5  # `git config --list` takes milliseconds; past this the repository is not listed by git

# The last component of a config key that names a program, and what it becomes. `cat` keeps
# textconv output meaningful, `true` makes a diff/merge driver a no-op, "" clears a list
# (credential helpers) or leaves a filter undefined.
_PROGRAM_KEYS: Mapping[str, str] = {
    "fsmonitor": "false",
    "hookspath": os.devnull,
    "pager": "cat",
    "editor": "true",
    "textconv": "cat",
    "command": "true",
    "external": "true",
    "driver": "true",
    "clean": "",
    "smudge": "",
    "process": "",
    "required": "false",
    "helper": "",
    "program": "true",
    "sshcommand": "true",
    "askpass": "true",
    "gitproxy": "true",
    "uploadpack": "true",
    "receivepack": "true",
    "packobjectshook": "true",
    "alternaterefscommand": "true",
}
# Always set, whether or not the repository mentions them (defaults can run programs too).
_ALWAYS = {"core.fsmonitor": "false", "core.hooksPath": os.devnull, "core.pager": "cat",
           "diff.external": "true", "core.sshCommand": "true", "credential.helper": ""}


class GitError(Exception):
    """git is missing, timed out or failed (the caller falls back to a plain walk)."""


def git_environment() -> dict[str, str]:
    """The process environment without `GIT_*` variables, plus the switches we rely on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_ATTR_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0",
               GIT_OPTIONAL_LOCKS="0", GIT_PAGER="cat", PAGER="cat", GIT_NO_REPLACE_OBJECTS="1")
    return env


def git_plain(root: Path, args: Sequence[str], timeout: float, warnings: list[str] | None = None,
              config: Mapping[str, str] | None = None) -> bytes:
    """`git -C root ARGS`; without `config` only for commands that read configuration.

    Args:
        warnings: When given, receives the lines git wrote to stderr on success.
        config: Keys set at command-line scope (see the module docstring).

    Raises:
        GitError: git is missing, timed out or exited non-zero.
    """
    env = git_environment()
    options: list[str] = []
    if config:
        env["GIT_CONFIG_COUNT"] = str(len(config))
        for n, (key, value) in enumerate(sorted(config.items())):
            env[f"GIT_CONFIG_KEY_{n}"], env[f"GIT_CONFIG_VALUE_{n}"] = key, value
            if "=" not in key:
                options += ["-c", f"{key}={value}"]
    command = ["git", "--no-pager", "-C", str(root), *options, *args]
    try:
        done = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, env=env,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        raise GitError(f"git {args[0] if args else ''}: {err}") from err
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {' '.join(args[:2])} exited {done.returncode}: {message[-1] if message else ''}")
    if warnings is not None:
        warnings.extend(done.stderr.decode("utf-8", "replace").splitlines())
    return done.stdout


def neutralizing_overrides(config_keys: Sequence[str]) -> dict[str, str]:
    """key -> harmless value for every program-valued key in `config_keys` (and `_ALWAYS`)."""
    values = dict(_ALWAYS)
    for key in config_keys:
        last = key.rsplit(".", 1)[-1].lower()
        if last in _PROGRAM_KEYS:
            values[key] = _PROGRAM_KEYS[last]
        if key.lower().startswith("pager."):
            values[key] = "false"
    return values


def config_keys(root: Path, timeout: float = CONFIG_TIMEOUT_S) -> list[str]:
    """Every key git's configuration holds for `root` (repository, includes, global).

    `git config --list` reads configuration only; it runs none of it.

    Raises:
        GitError: The configuration could not be read (then nothing is run on it).
    """
    raw = git_plain(root, ["config", "--null", "--list"], timeout)
    return [entry.split("\n", 1)[0] for entry in raw.decode("utf-8", "replace").split("\0") if entry]


def run_git(root: Path, args: Sequence[str], timeout: float = GIT_TIMEOUT_S,
            warnings: list[str] | None = None) -> bytes:
    """Runs `git -C root ARGS` with repository-configured programs disarmed; returns stdout.

    Args:
        warnings: When given, receives the lines git wrote to stderr on success.

    Raises:
        GitError: git is missing, timed out or exited non-zero.
    """
    overrides = neutralizing_overrides(config_keys(root))
    return git_plain(root, args, timeout, warnings, overrides)
