"""`codectx serve --http`: options, and running HTTP alone or beside the language server.

* ``codectx serve --http [HOST:]PORT`` serves HTTP only; the model loads at
  start (``--model``), and ``--workspace DIR`` adds the repository model.
* ``codectx serve --http [HOST:]PORT --stdio`` also speaks LSP on stdio (the
  editor's command line): one process, one engine. The engine is the one the
  language server loads from the editor's settings; HTTP answers 503 until it
  is up.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .config import HttpConfig, HttpConfigError, key_from_env, parse_listen

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
    group.add_argument("--api-key", help="require this key (Bearer) on every endpoint; default $CODECTX_API_KEY; "
                                         "mandatory off loopback")
    group.add_argument("--model", default="smollm2-135m",
                       help="HTTP alone: the model to load (name, directory, .gguf or hub id)")
    group.add_argument("--workspace", type=Path,
                       help="HTTP alone: a repository to serve as the 'codectx' model")
    group.add_argument("--max-body-bytes", type=int, default=HttpConfig.max_body_bytes,
                       help="largest request body accepted (413 above)")
    group.add_argument("--max-prompt-tokens", type=int,
                       help="longest prompt accepted (400 above); default the model's context length")


def config_from(args: argparse.Namespace) -> HttpConfig:
    """The validated `HttpConfig` for parsed arguments.

    Raises:
        HttpConfigError: Off loopback without a key, or bad limits.
    """
    host, port = args.http
    config = HttpConfig(host=host, port=port, api_key=key_from_env(args.api_key),
                        max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens)
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    """Runs HTTP alone or beside the language server; returns the exit status."""
    from .app import create_app
    from .runner import HttpServer
    from .source import LspSource, StandaloneSource

    try:
        config = config_from(args)
    except HttpConfigError as err:
        logger.error("%s", err)
        return 2
    if getattr(args, "tcp", None):
        logger.error("--http runs beside the language server on stdio (--stdio), not with --tcp")
        return 2
    if args.stdio:
        if args.workspace or args.model != "smollm2-135m":
            logger.warning("with --stdio the editor's settings choose the model and the workspace; "
                           "--model and --workspace are ignored")
        from server.lsp.app import server

        http = HttpServer(create_app(LspSource(server), config), config.host, config.port)
        http.start()
        try:
            server.start_io()
        finally:
            http.stop()
        return 0
    source = StandaloneSource.start(args.model, workspace=args.workspace)
    try:
        http = HttpServer(create_app(source, config), config.host, config.port)
        logger.info("codectx HTTP API on http://%s:%d (monitor: /monitor)", config.host, config.port)
        http.run()
    finally:
        source.close()
    return 0
