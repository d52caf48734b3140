"""The bytes a prompt's tokens hash and compare as (`engine.boundaries.token_bytes`), and a request's length."""
from __future__ import annotations

import numpy as np
import pytest

from engine import boundaries
from engine.boundaries import token_bytes
from engine.request import PromptSegment, Request

IDS = [0, 1, 255, 256, 65535, 65536, 151935, 2**32 - 1]


@pytest.mark.parametrize("native", [True, False])
def test_token_bytes_are_little_endian_uint32_on_either_path(native, monkeypatch):
    monkeypatch.setattr(boundaries, "_NATIVE_U32", native)
    expected = b"".join(int(t).to_bytes(4, "little") for t in IDS)
    assert token_bytes(IDS) == token_bytes(tuple(IDS)) == token_bytes(iter(IDS)) == expected
    assert token_bytes(np.array(IDS, dtype=np.int64)) == expected and token_bytes(()) == b""
    for bad in (-1, 2**32):
        with pytest.raises(OverflowError):
            token_bytes([1, bad])


def test_a_requests_length_is_its_tokens_count_without_listing_them():
    segments = [PromptSegment("system", "s", (1, 2, 3)), PromptSegment("file", "a.py", ()),
                PromptSegment("question", "q", (4, 5))]
    req = Request(segments=segments, max_tokens=1)
    assert req.all_token_ids() == [1, 2, 3, 4, 5] and req.prompt_length() == 5
    plain = Request(prompt_ids=[7, 8], max_tokens=1)
    assert plain.all_token_ids() == [7, 8] and plain.prompt_length() == 2


def test_a_requests_tokens_from_a_position_are_its_token_list_from_there():
    segments = [PromptSegment("system", "s", (1, 2, 3)), PromptSegment("file", "a.py", ()),
                PromptSegment("file", "b.py", (4,)), PromptSegment("question", "q", (5, 6, 7))]
    for req in (Request(segments=segments, max_tokens=1), Request(prompt_ids=[1, 2, 3, 4, 5, 6, 7], max_tokens=1)):
        assert [req.token_ids_from(i) for i in range(9)] == [[1, 2, 3, 4, 5, 6, 7][i:] for i in range(9)]
        assert req.all_token_ids() == req.token_ids_from(0)


def test_token_ids_outside_uint32_raise_from_a_numpy_array_too():
    for bad in (-1, 2**32):
        with pytest.raises(OverflowError):
            token_bytes(np.array([1, bad], dtype=np.int64))
