"""`codectx`: the command-line entry point (console script `server.cli:main`).

Each subcommand is one entry in `SUBCOMMANDS`: a name, a one-line help and
the "module:function" that runs it. The function takes the remaining
arguments (`main(argv: list[str]) -> int`) and parses them itself, so its
module, and MLX behind it, is imported only when that subcommand runs:
`codectx --help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Subcommand:
    """A subcommand's target ("package.module:function") and its one-line help."""

    target: str
    help: str

    def load(self) -> Callable[[list[str]], int]:
        module_name, _, function = self.target.partition(":")
        return getattr(importlib.import_module(module_name), function)


SUBCOMMANDS: dict[str, Subcommand] = {
    "ask": Subcommand("server.ask_cmd:main", "answer a question about a repository (streams to stdout)"),
    "eval": Subcommand("server.eval_cmd:main", "measure what windowed prefill / 8-bit KV cost in answers"),
    "doctor": Subcommand("server.doctor:main", "check Python, MLX, BLAS, the default model, the cache dir; the best model found"),
    "models": Subcommand("server.models_cmd:main", "list the models on this machine (Ollama, LM Studio, caches)"),
    "context": Subcommand("server.context_cmd:main", "show the ordered, hashed segments built from a repository"),
    "serve": Subcommand("server.serve_cmd:main", "run the language server on stdio (--http: the OpenAI-compatible API)"),
    "measure": Subcommand("server.measure_cmd:main", "time one request against a running codectx serve --http"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; each subcommand's own options are parsed by its module."""
    parser = argparse.ArgumentParser(
        prog="codectx",
        description="A language server that keeps a whole repository warm inside a local LLM.",
        epilog="Run 'codectx COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, sub in SUBCOMMANDS.items():
        commands.add_parser(name, help=sub.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the subcommand name and hand the rest of the arguments to it.

    Returns:
        The subcommand's exit status.
    """
    _standard_streams()
    args, rest = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
    from context.home import prepare_home  # before anything (BLAS preload) writes into it

    for problem in prepare_home():
        logging.getLogger("codectx").warning("%s", problem)
    return _run(args.command, rest)


def _run(name: str, argv: list[str]) -> int:
    """Runs one subcommand; an error it lets through ends the run with one line and the
    status of its kind (`server.exit_status`); an unexpected one keeps its traceback."""
    from server.core.errors import Category, classify
    from server.exit_status import INTERRUPTED, PIPE_CLOSED, UsageError, status_for

    try:
        return SUBCOMMANDS[name].load()(argv)
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:  # `codectx ask ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit's flush)
        return PIPE_CLOSED
    except Exception as err:
        if not isinstance(err, UsageError) and classify(err).category is Category.INTERNAL:
            raise
        sys.stderr.write(f"codectx {name}: {err}\n")
        return status_for(err)


def _standard_streams() -> None:
    """Give a closed standard stream (`codectx ask ... <&-`, a service manager's `>&-`) /dev/null: otherwise
    the next file opened takes its number (MLX then refused a model file opened as descriptor 0) and a
    print finds no stream."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, mode, encoding="utf-8", errors="replace", closefd=False))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("codectx")
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
