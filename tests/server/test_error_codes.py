"""docs/protocol.md's error table is `server/lsp/errors.py`'s codes, and ours never reuse a reserved one."""
from __future__ import annotations

import re
from pathlib import Path

from pygls.exceptions import JsonRpcException

from server.core.errors import Category
from server.lsp import errors

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
# Codes JSON-RPC 2.0 and LSP 3.17 define, whatever server sends them.
STANDARD = {-32700, -32600, -32601, -32602, -32603, -32001, -32002, -32803, -32802, -32801, -32800}


def documented_codes() -> set[int]:
    section = DOC.read_text(encoding="utf-8").split("## Errors", 1)[1].split("\n## ", 1)[0]
    return {int(code) for code in re.findall(r"^\|\s*`(-\d+)`", section, flags=re.MULTILINE)}


def our_codes() -> dict[str, int]:
    return {name: value for name, value in vars(errors).items() if name.isupper() and isinstance(value, int)}


def test_every_code_the_server_sends_is_documented_and_every_documented_code_is_sent():
    sent = set(our_codes().values()) | {-32601, -32603}  # pygls sends MethodNotFound and InternalError
    assert documented_codes() == sent


def test_codectx_codes_lie_outside_the_reserved_ranges_and_differ():
    own = {name: code for name, code in our_codes().items() if code not in STANDARD}
    assert own, "the server defines codes of its own"
    assert all(not -32768 <= code <= -32000 for code in own.values()), own
    assert len(set(own.values())) == len(own), own


def test_a_failed_model_load_is_not_mistaken_for_server_not_initialized():
    load_failed = errors._CODES[Category.MODEL_LOAD_FAILED]
    before_initialize = errors.to_rpc_error(errors.ServerNotInitializedError("textDocument/hover before initialize"))
    assert isinstance(before_initialize, JsonRpcException)
    assert before_initialize.code == -32002 and load_failed != -32002
