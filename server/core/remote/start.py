"""`start_remote_backend`: the `RemoteBackend` the `engine.*` settings name."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ..settings import Settings
from .backend import RemoteBackend
from .openai_stream import Endpoint, RemoteEngineError, ServerAnswerError, UnreachableError

logger = logging.getLogger(__name__)


def start_remote_backend(settings: Settings) -> RemoteBackend:
    """Loads the local model's tokenizer (no weights) and connects to `engine.url`.

    The server is asked for its models (`GET {url}/models`) for the `model` to send when
    `engine.model` is empty; one that cannot be reached yet is tried again by each request.

    Raises:
        RemoteEngineError: The URL is not http(s) or the key file is unreadable.
        ModelNotFoundError, ModelLoadError: The local model directory has no usable tokenizer.
    """
    from engine.loading import load_tokenizer

    engine = settings.engine
    endpoint = Endpoint(engine.url, key=engine_key(settings))
    tokenizer, model_id, context_length = load_tokenizer(settings.model.name)
    served = engine.model or first_model(endpoint)
    check = tokenizer_check(endpoint, tokenizer)
    if check.startswith("differs"):
        logger.warning("the engine's tokenizer %s: prompts are laid out and budgets counted with %s's", check, model_id)
    logger.info("remote engine at %s, model %s (tokenizer: %s, %s)", engine.url, served, model_id, check)
    backend = RemoteBackend(endpoint, tokenizer, model_id, served, context_length)
    backend.set_generation(settings.generation)
    backend.tokenizer_check = check
    return backend


TOKENIZER_PROBE = ("<|im_start|>user\ndef naïve_sum(xs: list[int]) -> int:\n    return sum(x ** 2 for x in xs)"
                   "  # 日本語 émoji 🙂<|im_end|>\n")
"""Text whose tokens tell tokenizers apart: special tokens, code, indentation, non-ASCII."""


def tokenizer_check(endpoint: Endpoint, tokenizer) -> str:
    """"matches", "differs: …" or "not checked: …": the local tokenizer's ids of
    `TOKENIZER_PROBE` against the server's (`POST /tokenize`, llama.cpp's server)."""
    try:
        theirs = endpoint.post_json("/tokenize", {"content": TOKENIZER_PROBE, "add_special": False,
                                                  "parse_special": True}).get("tokens")
    except RemoteEngineError as err:
        return f"not checked: the server has no tokenize endpoint ({err})"
    ours = tokenizer.encode(TOKENIZER_PROBE)
    if theirs == ours:
        return "matches"
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs or [])))
    return f"differs: {len(ours)} local tokens against {len(theirs or [])} from the server, first difference at {first}"


def engine_key(settings: Settings) -> str:
    """The key from `engine.keyFile`, else from the `engine.keyEnv` variable, else ""."""
    engine = settings.engine
    if engine.key_file:
        try:
            return Path(engine.key_file).expanduser().read_text(encoding="utf-8").strip()
        except OSError as err:
            raise RemoteEngineError(f"cannot read engine.keyFile {engine.key_file}: {err}") from err
    return os.environ.get(engine.key_env, "").strip() if engine.key_env else ""


def first_model(endpoint: Endpoint) -> str:
    """The first model the server lists, or "" (requests then name none, and the server uses
    the one it was started with) when it lists none or cannot list them (`mlx_lm.server`
    fails its model list without a Hugging Face cache folder).

    A server that cannot be reached yet is not an error here: the backend starts, and each
    request tries again (`RemoteBackend.unreachable`).
    """
    try:
        listed = endpoint.get_json("models").get("data") or []
    except UnreachableError as err:
        logger.warning("%s: starting anyway; requests try again (background ones back off)", err)
        return ""
    except ServerAnswerError as err:
        logger.warning("the engine did not list its models (%s): requests name no model", err)
        return ""
    return listed[0].get("id", "") if listed and isinstance(listed[0], dict) else ""
