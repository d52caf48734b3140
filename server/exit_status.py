"""The exit statuses of every `codectx` command, one per kind of error.

| status | kind |
|---|---|
| 0 | done |
| 1 | the run failed: a model that cannot be loaded, an engine or context error, a port in use, a server that cannot be reached |
| 2 | the command line cannot run as asked: a bad option, an empty question, a path that is not there, a model that is not found |
| 130 | interrupted (Ctrl-C) |
| 141 | the output's reader went away (`codectx ask` piped into `head`), as a shell reports SIGPIPE |

Commands raise `UsageError` for the second kind; `status_for` maps every other error
through the core's categories (`server.core.errors`), so the same cause gives the same
status whichever command meets it.
"""
from __future__ import annotations

from pathlib import Path

OK, FAILED, USAGE, INTERRUPTED, PIPE_CLOSED = 0, 1, 2, 130, 141


class UsageError(Exception):
    """The command line cannot run as asked (exit status 2)."""


def status_for(err: BaseException) -> int:
    """The exit status for `err`: USAGE for usage errors, invalid arguments, a workspace
    that is not a folder, a budget too small and a model that is not found, INTERRUPTED for
    Ctrl-C, FAILED for anything else."""
    from context.errors import BudgetError, WorkspaceError
    from server.core.errors import Category, classify

    if isinstance(err, UsageError | WorkspaceError | BudgetError):
        return USAGE
    if isinstance(err, KeyboardInterrupt):
        return INTERRUPTED
    category = classify(err).category
    return USAGE if category in (Category.MODEL_NOT_FOUND, Category.INVALID_ARGUMENTS) else FAILED


def check_folder(option: str, path: Path | str) -> Path:
    """`path` when it is a folder.

    Raises:
        UsageError: "OPTION PATH: not a folder", the same words from every command.
    """
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{option} {path}: not a folder")
    return path
