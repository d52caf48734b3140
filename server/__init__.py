"""codectx's editor-facing side: the language server (`server.lsp`) and the `codectx` CLI.

Importing this package imports nothing heavy; MLX loads only when a command needs the engine.
"""
