"""The HTTP side of codectx: an OpenAI-compatible API, /metrics and a live /monitor page.

`create_app(source, config)` builds the Starlette app over an `EngineSource`
(the editor's engine when the language server runs in the same process, or
one loaded for HTTP alone); `HttpServer` runs it with uvicorn in a thread.
See docs/http.md.
"""
