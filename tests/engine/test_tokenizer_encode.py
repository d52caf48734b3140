"""`Tokenizer.encode` counts text of any length without transformers' warning past the model's length
(an editor shows the server's stderr lines as errors; the fit in the context is checked where a
prompt is built)."""
from __future__ import annotations

import logging

from engine.loading import load_tokenizer
from tests.engine.tiny_models import build_tiny_model


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_text_longer_than_the_model_is_encoded_without_a_warning(tmp_path):
    tokenizer = load_tokenizer(str(build_tiny_model(tmp_path / "model")))[0]
    records = Records()
    library = logging.getLogger("transformers")  # its own handler; it does not propagate to pytest's
    library.addHandler(records)
    try:
        text = "def f(x):\n    return x + 1\n" * 2000
        ids = tokenizer.encode(text)
    finally:
        library.removeHandler(records)
    assert len(ids) > tokenizer.hf.model_max_length == 4096
    assert ids == tokenizer.hf(text, add_special_tokens=False, verbose=False)["input_ids"]
    assert not [m for m in records.messages if "sequence length" in m], records.messages
