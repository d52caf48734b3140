"""A `TextTokenizer` over a Hugging Face `tokenizers.Tokenizer` (no MLX, no transformers)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import xxhash

from context.errors import ContextError


class HFTokenizer:
    """Wraps a `tokenizers.Tokenizer` so `context` can use it.

    Args:
        tokenizer: A `tokenizers.Tokenizer`.
        chat_template: The model's chat template, if any.
        bos_token: The BOS string templates may reference as `bos_token`.
        eos_token: The EOS string templates may reference as `eos_token`.
    """

    def __init__(self, tokenizer, chat_template: str | None = None,
                 bos_token: str = "", eos_token: str = "") -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.fingerprint = xxhash.xxh3_64_hexdigest(tokenizer.to_str().encode("utf-8"))

    @classmethod
    def from_dir(cls, path: str | Path) -> "HFTokenizer":
        """Loads `tokenizer.json` (+ `tokenizer_config.json` for the template) from a folder.

        Raises:
            ContextError: No readable tokenizer.json in `path`.
        """
        from tokenizers import Tokenizer

        folder = Path(path)
        if folder.is_file():
            folder = folder.parent
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # tokenizers raises plain Exception subclasses
            raise ContextError(f"cannot load tokenizer.json from {folder}: {err}") from err
        config: dict = {}
        config_path = folder / "tokenizer_config.json"
        if config_path.is_file():
            config = json.loads(config_path.read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(tok, template, _token_str(config.get("bos_token")), _token_str(config.get("eos_token")))

    @property
    def backend(self):
        """The wrapped `tokenizers.Tokenizer`."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def _token_str(value) -> str:
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""
