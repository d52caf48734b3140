"""A scripted stand-in for `engine.Engine`, for the tool loop only.

The tiny random-weight model cannot produce tool calls, so these tests script
the model's output (docs/protocol.md says so). Everything else in the loop is
real: prompt building (context's workspace and access policy), tool-call
parsing, the tools, the conversation.
"""
from __future__ import annotations

from engine.request import DoneEvent, Metrics, Request, TokenEvent
from server.lsp.convert import UTF16
from server.lsp.documents import DocumentStore
from server.core.backend import EngineBackend
from server.core.session import LoadingSession, Session
from server.core.settings import parse_settings
from server.core.tools import TOOLS_PROMPT
from server.core.prompt import WorkspacePrompt


class ByteTokenizer:
    """UTF-8 bytes as token ids; ChatML-like rendering."""

    fingerprint = "bytes-v1"
    chat_template = None  # context frames prompts as ChatML

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(ids).decode("utf-8")

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(256)}  # one byte a token (as a byte-level vocabulary spells them)

    def render_chat(self, messages, add_generation_prompt: bool = True, tools=None) -> str:
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        return text + ("<|assistant|>\n" if add_generation_prompt else "")


class _Handle:
    def __init__(self, request: Request, text: str) -> None:
        self.request, self.text = request, text

    async def __aiter__(self):
        for piece in self.text.split(" "):
            yield TokenEvent(self.request.request_id, piece + " ", ())
        metrics = Metrics(prompt_tokens=len(self.request.all_token_ids()), decode_tokens=len(self.text.split(" ")))
        yield DoneEvent(self.request.request_id, "stop", self.text + " ", metrics)


class ScriptedEngine:
    """Answers request N with `outputs[N]` (the last one repeats); records every request."""

    def __init__(self, outputs: list[str]) -> None:
        self.outputs = outputs
        self.requests: list[Request] = []

    def submit(self, request: Request, on_progress=None) -> _Handle:
        text = self.outputs[min(len(self.requests), len(self.outputs) - 1)]
        self.requests.append(request)
        return _Handle(request, text)

    def cancel(self, request_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def session_for(root, outputs: list[str], **settings) -> tuple[Session, ScriptedEngine]:
    """A session over `root` whose engine answers with `outputs` (settings as client JSON)."""
    parsed, problems = parse_settings(settings or None)
    if problems:
        raise ValueError(f"bad test settings: {problems}")
    base = LoadingSession(parsed, DocumentStore(UTF16), root)
    engine = ScriptedEngine(outputs)
    tokenizer = ByteTokenizer()
    prompt = WorkspacePrompt(root, tokenizer, lambda p: None, TOOLS_PROMPT, parsed.context)
    session = Session(base, EngineBackend(engine, tokenizer, "scripted"), prompt)
    return session, engine
