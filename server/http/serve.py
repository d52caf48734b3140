"""`codectx serve --http`: options, and running HTTP alone or beside the language server.

* ``codectx serve --http [HOST:]PORT`` serves HTTP only; the model loads at
  start (``--model``), and ``--workspace DIR`` adds the repository model.
* ``codectx serve --http [HOST:]PORT --stdio`` also speaks LSP on stdio (the
  editor's command line): one process, one engine. The engine is the one the
  language server loads from the editor's settings; HTTP answers 503 until it
  is up. `server.serve_cmd` wires the two transports (`prepare`, `start_beside`);
  this package never imports the language server.
"""
from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from server.exit_status import FAILED, USAGE, check_folder

from .config import HttpConfig, HttpConfigError, parse_listen
from .keys import resolve_api_key

if TYPE_CHECKING:
    from .runner import HttpServer
    from .source import EngineSource

logger = logging.getLogger(__name__)


def _listen(value: str) -> tuple[str, int]:
    try:
        return parse_listen(value)
    except HttpConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the HTTP options to `codectx serve`'s parser."""
    group = parser.add_argument_group("HTTP API (docs/http.md)")
    group.add_argument("--http", type=_listen, metavar="[HOST:]PORT",
                       help="serve the OpenAI-compatible API, /metrics and /monitor (host defaults to 127.0.0.1)")
    group.add_argument("--stdio", action="store_true",
                       help="with --http: also run the language server on stdio, sharing its engine")
    group.add_argument("--api-key-file", type=Path, metavar="PATH",
                       help="require the key in this file (not readable by other users) on every endpoint; "
                            "default $CODECTX_API_KEY; a key is mandatory off loopback")
    group.add_argument("--api-key", help="the key itself (visible in the process list: prefer "
                                         "$CODECTX_API_KEY or --api-key-file)")
    group.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                       help="also answer requests sent to this host name (repeatable; loopback names and "
                            "the bound address are always answered)")
    group.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="let web pages from this origin (e.g. http://localhost:3000) call the API "
                            "(repeatable)")
    group.add_argument("--model", default="smollm2-135m",
                       help="HTTP alone: the model to load (name, directory, .gguf or hub id)")
    group.add_argument("--workspace", type=Path,
                       help="HTTP alone: a repository to serve as the 'codectx' model")
    group.add_argument("--engine-url", default="",
                       help="HTTP alone: answer on this OpenAI-compatible engine server (docs/remote.md); "
                            "--model then names the local tokenizer's model (the editor's settings choose for "
                            "the language server: engine.url)")
    group.add_argument("--max-body-bytes", type=int, default=HttpConfig.max_body_bytes,
                       help="largest request body accepted (413 above)")
    group.add_argument("--max-prompt-tokens", type=int,
                       help="longest prompt accepted (400 above); default the model's context length")
    group.add_argument("--max-connections", type=int, default=HttpConfig.max_connections,
                       help="connections served at once; more get 503")
    group.add_argument("--idle-timeout", type=float, default=HttpConfig.idle_timeout_s, metavar="SECONDS",
                       help="close a connection that sends nothing for this long between requests")
    group.add_argument("--request-timeout", type=float, default=HttpConfig.request_timeout_s, metavar="SECONDS",
                       help="time a client has to send a whole request (headers and body); 408 after")


def config_from(args: argparse.Namespace) -> HttpConfig:
    """The validated `HttpConfig` for parsed arguments.

    Raises:
        HttpConfigError: Off loopback without a key, an unusable key file, or bad limits.
    """
    host, port = args.http
    config = HttpConfig(host=host, port=port, api_key=resolve_api_key(args.api_key, args.api_key_file),
                        max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                        allowed_hosts=tuple(args.allow_host), allowed_origins=tuple(args.allow_origin),
                        max_connections=args.max_connections, idle_timeout_s=args.idle_timeout,
                        request_timeout_s=args.request_timeout)
    config.validate()
    return config


def prepare(args: argparse.Namespace) -> tuple[HttpConfig, socket.socket] | int:
    """The validated config and the bound listening socket, or the exit status to end with.

    The port is bound before the model loads, so a port in use fails at once
    with one line and status 1 (FAILED); configuration errors give status 2 (USAGE).
    """
    from .runner import ListenError, bind_listener

    try:
        config = config_from(args)
    except HttpConfigError as err:
        logger.error("%s", err)
        return USAGE
    if getattr(args, "tcp", None):
        logger.error("--http runs beside the language server on stdio (--stdio), not with --tcp")
        return USAGE
    try:
        return config, bind_listener(config.host, config.port)
    except ListenError as err:
        logger.error("%s", err)
        return FAILED


def start_beside(source: EngineSource, config: HttpConfig, sock: socket.socket) -> HttpServer:
    """Starts HTTP on its own thread over `source` (the editor's session); stop it when done."""
    from .app import create_app
    from .runner import HttpServer

    http = HttpServer(create_app(source, config), config.host, config.port, config, sock)
    http.start()
    return http


def engine_settings(args: argparse.Namespace):
    """The core's default settings with `--engine-url` as `engine.url`."""
    import dataclasses

    from server.core.settings import Settings

    defaults = Settings()
    return dataclasses.replace(defaults, engine=dataclasses.replace(defaults.engine, url=args.engine_url))


def run(args: argparse.Namespace) -> int:
    """Runs HTTP alone (the model loads here, `--workspace` adds the repository model);
    returns the exit status.

    Raises:
        UsageError: `--workspace` is not a folder.
    """
    from .app import create_app
    from .runner import HttpServer
    from .source import StandaloneSource

    if args.workspace is not None:
        check_folder("--workspace", args.workspace)  # UsageError: one line and status 2 (server.cli)
    prepared = prepare(args)
    if isinstance(prepared, int):
        return prepared
    config, sock = prepared
    try:
        source = StandaloneSource.start(args.model, workspace=args.workspace, settings=engine_settings(args))
    except BaseException:
        sock.close()
        raise
    try:
        HttpServer(create_app(source, config), config.host, config.port, config, sock).run()
    finally:
        source.close()
    return 0
