"""The transport-independent server core: session, backend, prompt, settings, tools and features.

The language server (`server.lsp`), the HTTP API (`server.http`) and the CLI commands are
transports over it; nothing here imports pygls, lsprotocol or starlette.
"""
