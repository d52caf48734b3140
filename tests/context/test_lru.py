"""`LRUDict`: bounded by weight, least recently used out first."""
from __future__ import annotations

from context.lru import LRUDict
from context.tokencache import TokenCache


def test_capacity_counts_weight_and_recent_use_protects_an_entry():
    cache: LRUDict[str, tuple] = LRUDict(10, weight=len)
    cache["a"] = (1,) * 4
    cache["b"] = (2,) * 4
    assert cache.get("a") == (1,) * 4  # "a" is now the most recent
    cache["c"] = (3,) * 4  # 12 > 10: the least recent ("b") goes
    assert "b" not in cache and "a" in cache and "c" in cache
    assert cache.total == 8 and cache.evicted == 1
    cache["a"] = (9,) * 2  # replacing re-weighs
    assert cache.total == 6
    cache["huge"] = (0,) * 50  # the newest entry is kept even over capacity
    assert list(cache) == ["huge"] and cache.total == 50


def test_token_cache_memory_is_bounded_and_misses_re_tokenize(monkeypatch):
    class Chars:
        fingerprint, chat_template = "chars", None

        def encode(self, text):
            return [ord(c) for c in text]

    monkeypatch.setattr("context.tokencache.MAX_LIVE_TOKENS", 100)
    tokens = TokenCache(Chars(), persist=False)
    for i in range(50):  # 50 edits of a file: 50 versions of its text
        assert tokens.encode(f"version {i:03d} of a file\n") == tuple(ord(c) for c in f"version {i:03d} of a file\n")
    assert tokens._live.total <= 100 and len(tokens._live) == 4
    misses = tokens.misses
    assert tokens.encode("version 000 of a file\n")[0] == ord("v")  # evicted: tokenized again
    assert tokens.misses == misses + 1


def test_a_batch_larger_than_the_bound_is_encoded_whole(monkeypatch):
    """A cold scan tokenizes a repository's files as one batch; one over the live bound (4M tokens, about
    16 MB of source) evicted its own first texts before they were read back (KeyError: no scan, ever)."""
    class Chars:
        fingerprint, chat_template = "chars", None

        def encode(self, text):
            return [ord(c) for c in text]

        def encode_batch(self, texts):
            return [self.encode(t) for t in texts]

    monkeypatch.setattr("context.tokencache.MAX_LIVE_TOKENS", 100)
    tokens = TokenCache(Chars(), persist=False)
    texts = [f"file {i:03d}: some source\n" for i in range(20)]  # 20 x 23 tokens, 4.6 times the bound
    assert tokens.encode_many(texts) == [tuple(ord(c) for c in t) for t in texts]
    assert tokens._live.total <= 100
