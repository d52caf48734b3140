"""`codectx serve`: the language server over stdio (or TCP on loopback for debugging).

With `--http [HOST:]PORT` it serves the OpenAI-compatible API instead, or beside
the language server with `--stdio` (this entry point wires the two transports over
the language server's session; server/http/serve.py runs HTTP alone).

stdout is the LSP channel. The language server sends its log to the client as
`window/logMessage` and writes only warnings and errors to stderr (editors show a
server's stderr as errors); `--stderr-level` (or `CODECTX_STDERR_LEVEL`) writes more
there. HTTP alone writes its log to stderr; `--log-file` takes everything instead.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from context.home import prepare_home

LOOPBACK = "127.0.0.1"
LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = LOOPBACK, value
    if not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT or PORT, got {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]: a socket takes ::1
    return host or LOOPBACK, int(port)


def _loopback_host_port(value: str) -> tuple[str, int]:
    """`_host_port`, on a loopback host only: the language server has no key, whoever connects is the editor
    (picks the workspace, the engine URL and its key file)."""
    from server.http.config import is_loopback

    host, port = _host_port(value)
    if not is_loopback(host):
        raise argparse.ArgumentTypeError(
            f"--tcp listens on loopback only ({host!r} is not): the language server has no authentication, and "
            "whoever connects chooses the workspace and settings; from another machine, forward the port over SSH")
    return host, port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `serve`'s options to a (sub)parser."""
    parser.add_argument("--tcp", type=_loopback_host_port, metavar="[HOST:]PORT",
                        help=f"listen on TCP instead of stdio, for debugging: a loopback host only (default {LOOPBACK})")
    parser.add_argument("--log-file", help="write logs here instead of stderr")
    parser.add_argument("--log-level", default="INFO", choices=LEVELS,
                        help="what is logged (to the client as window/logMessage, or to --log-file)")
    parser.add_argument("--stderr-level", default=os.environ.get("CODECTX_STDERR_LEVEL") or None,
                        choices=LEVELS, help="what the language server also writes to stderr (default WARNING, "
                                             "or $CODECTX_STDERR_LEVEL; HTTP alone: --log-level)")
    from server.http.serve import add_arguments as add_http_arguments

    add_http_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Runs the server until the client exits; returns the exit status. On stdio the
    process ends here instead, with 0 after `shutdown` + `exit` and 1 for `exit` or end
    of input without `shutdown`."""
    _configure_logging(args)

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


def _configure_logging(args: argparse.Namespace) -> None:
    """The log to `--log-file`, or: HTTP alone to stderr; the language server to the
    client (window/logMessage) and warnings and errors (`--stderr-level`) to stderr."""
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    editor = not args.http or args.stdio
    if args.log_file:
        try:
            handler: logging.Handler = logging.FileHandler(args.log_file)
        except OSError as err:  # a folder, a missing folder, no permission
            sys.stderr.write(f"codectx serve: cannot write the log file {args.log_file}: {err.strerror}\n")
            raise SystemExit(2) from err
    else:
        handler = logging.StreamHandler(sys.stderr)
        if editor:
            handler.addFilter(_StderrFilter(logging.getLevelName(args.stderr_level or "WARNING")))
    handler.setFormatter(formatter)
    handlers = [handler]
    if editor:
        from server.lsp.app import server
        from server.lsp.client_log import ClientLogHandler

        server.client_log = ClientLogHandler(server)
        server.client_log.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handlers.append(server.client_log)
    logging.basicConfig(level=args.log_level, handlers=handlers, force=True)
    logging.getLogger("pygls").setLevel(max(logging.WARNING, logging.getLevelName(args.log_level)))


class _StderrFilter(logging.Filter):
    """Records at `level` or above pass, and whatever its level a line a person at the
    terminal needs (a record logged with `extra={"announce": True}`: the HTTP address)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or bool(getattr(record, "announce", False))


def _serve_beside_editor(args: argparse.Namespace) -> int:
    """HTTP on its own thread over the language server's session, LSP on stdio: one engine.

    Returns the exit status (the language server's, or the HTTP set-up's when that fails).
    """
    from server.http.serve import prepare, start_beside
    from server.http.source import SessionSource

    prepared = prepare(args)
    if isinstance(prepared, int):
        return prepared
    if args.workspace or args.model != "smollm2-135m" or args.engine_url:
        logging.getLogger("codectx").warning("with --stdio the editor's settings choose the model, the engine and "
                                             "the workspace; --model, --engine-url and --workspace are ignored")
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
