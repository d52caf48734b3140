"""The server core's `Backend` over a remote, OpenAI-compatible engine server (docs/remote.md)."""
