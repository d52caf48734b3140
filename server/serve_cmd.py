"""`codectx serve`: the language server over stdio (or TCP on loopback for debugging).

With `--http [HOST:]PORT` it serves the OpenAI-compatible API instead, or beside
the language server with `--stdio` (this entry point wires the two transports over
the language server's session; server/http/serve.py runs HTTP alone).

stdout is the LSP channel, so logs go to stderr or to `--log-file`.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from context.home import prepare_home

LOOPBACK = "127.0.0.1"


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = LOOPBACK, value
    if not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT or PORT, got {value!r}")
    return host or LOOPBACK, int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `serve`'s options to a (sub)parser."""
    parser.add_argument("--tcp", type=_host_port, metavar="[HOST:]PORT",
                        help=f"listen on TCP instead of stdio (host defaults to {LOOPBACK})")
    parser.add_argument("--log-file", help="write logs here instead of stderr")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    from server.http.serve import add_arguments as add_http_arguments

    add_http_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Runs the server until the client exits; returns the exit status. On stdio the
    process ends here instead, with 0 after `shutdown` + `exit` and 1 for `exit` or end
    of input without `shutdown`."""
    handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level, handlers=[handler], force=True)
    logging.getLogger("pygls").setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))

    for problem in prepare_home():  # `python -m server.serve_cmd` does not pass through server.cli
        logging.getLogger("codectx").warning("%s", problem)
    if args.http and args.stdio:
        _end_process(_serve_beside_editor(args))
    if args.http:
        from server.http.serve import run as run_http

        return run_http(args)

    from server.lsp.app import server

    if args.tcp:
        server.start_tcp(*args.tcp)
        return 0
    from server.lsp.stdio import serve_stdio

    _end_process(serve_stdio(server))


def _serve_beside_editor(args: argparse.Namespace) -> int:
    """HTTP on its own thread over the language server's session, LSP on stdio: one engine.

    Returns the exit status (the language server's, or the HTTP set-up's when that fails).
    """
    from server.http.serve import prepare, start_beside
    from server.http.source import SessionSource

    prepared = prepare(args)
    if isinstance(prepared, int):
        return prepared
    if args.workspace or args.model != "smollm2-135m":
        logging.getLogger("codectx").warning("with --stdio the editor's settings choose the model and the "
                                             "workspace; --model and --workspace are ignored")
    from server.lsp.app import server
    from server.lsp.stdio import serve_stdio

    http = start_beside(SessionSource(server), *prepared)
    try:
        return serve_stdio(server)  # our framing and LSP's exit codes, as without --http
    finally:
        http.stop()


def _end_process(status: int) -> NoReturn:
    """Ends the process with `status` once the server has closed everything.

    The engine runs MLX on a worker thread, and MLX's native threads can then abort
    the interpreter's own teardown (std::terminate in a static destructor, status
    -6 about once in twenty exits), which would turn LSP's exit status into a crash.
    The engine is closed and stdout flushed by now, so the process ends here.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="codectx serve", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
