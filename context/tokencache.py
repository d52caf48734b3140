"""Token ids by (tokenizer fingerprint, text hash), persisted with msgpack."""
from __future__ import annotations

import array
import logging
import re
import sys
from pathlib import Path
from typing import Callable, Iterator, Sequence

import xxhash

from context import store
from context.home import codectx_home
from context.lru import LRUDict
from context.tokenizer import BatchTextTokenizer, TextTokenizer

log = logging.getLogger(__name__)

_MAX_SAVED_TOKENS = 64_000_000
"""Entries not used in this session are dropped from the file beyond this many tokens."""
MAX_LIVE_TOKENS = 4_000_000
"""Token ids kept in memory (~36 bytes a token as Python ints: at most ~150 MB), several times a
large repository's prefix; older entries are re-read from disk or re-tokenized when needed."""
COUNT_BATCH_CHARS = 1 << 20
"""Characters a cold count tokenizes in one call: between calls it reports progress, and a progress callback may
stop it. (Its cost against one call was timed once, in the twentieth session, by a script not kept; the cold builds
of bench/context.py are the reproducible measure.)"""


_MIN_CHUNK = 512
_BREAK = re.compile(r"\S\n(?=\S)")


def _batches(items: list[tuple[int, str]], chars: int) -> Iterator[list[tuple[int, str]]]:
    """`items` ((index, text)) in order, in runs of about `chars` characters (a longer text alone)."""
    batch: list[tuple[int, str]] = []
    size = 0
    for item in items:
        if batch and size + len(item[1]) > chars:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item[1])
    if batch:
        yield batch


def chunks(text: str) -> list[str]:
    """Splits text at clean breaks (a line end after a non-space, before a non-space), in pieces of
    at least ~512 characters. Tokenization is concatenative across such breaks (the segment rule),
    so an edit re-tokenizes only the chunks it touches.
    """
    out: list[str] = []
    start = 0
    search = _BREAK.search
    while True:
        m = search(text, start + _MIN_CHUNK)
        if m is None:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out


def text_key(text: str) -> bytes:
    """The cache key of a text (xxh3-128 of its UTF-8 bytes)."""
    return xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass"))


def _ids_row(key: object, value: object) -> bool:
    return isinstance(key, bytes) and isinstance(value, bytes) and len(value) % 4 == 0


def _count_row(key: object, value: object) -> bool:
    return isinstance(key, bytes) and type(value) is int and value >= 0


def _pack(ids: Sequence[int]) -> bytes:
    a = array.array("I", ids)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def _unpack(blob: bytes) -> tuple[int, ...]:
    a = array.array("I")
    a.frombytes(blob)
    if sys.byteorder != "little":
        a.byteswap()
    return tuple(a)


class TokenCache:
    """Tokenizes texts once per tokenizer and remembers the ids.

    Args:
        tokenizer: The tokenizer; its fingerprint names the cache file.
        path: The msgpack file; default `$CODECTX_HOME/tokens/<fingerprint>.msgpack`.
            None-able through `persist=False`.
        persist: Load from and save to disk.
    """

    def __init__(self, tokenizer: TextTokenizer, path: Path | None = None, persist: bool = True) -> None:
        self.tokenizer = tokenizer
        self.path = path or codectx_home() / "tokens" / f"{tokenizer.fingerprint}.msgpack"
        self.persist = persist
        self._stored_data: dict[bytes, bytes] | None = None if persist else {}
        # Every edit adds the changed chunk's ids: bounded, least recently used first out.
        self._live: LRUDict[bytes, tuple[int, ...]] = LRUDict(MAX_LIVE_TOKENS, weight=len)
        self._counts_path = self.path.with_name(self.path.stem + ".counts.msgpack")
        self._counts: dict[bytes, int] = store.load(self._counts_path, _count_row) if persist else {}
        self._dirty = False
        self.hits = 0
        self.misses = 0

    @property
    def _stored(self) -> dict[bytes, bytes]:
        # Loaded on first need: a warm budgeted build may only need counts.
        if self._stored_data is None:
            self._stored_data = store.load(self.path, _ids_row)
        return self._stored_data

    @_stored.setter
    def _stored(self, value: dict[bytes, bytes]) -> None:
        self._stored_data = value

    def encode(self, text: str) -> tuple[int, ...]:
        """The ids of `text` (cached)."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """The ids of each text; misses are tokenized in one batch when the tokenizer can."""
        keys = [text_key(t) for t in texts]
        out: list[tuple[int, ...] | None] = []
        missing: dict[bytes, str] = {}
        for key, text in zip(keys, texts):
            ids = self._live.get(key)
            if ids is None and key in self._stored:
                ids = self._live[key] = _unpack(self._stored[key])
            if ids is None:
                missing[key] = text
            out.append(ids)
        if missing:
            self.misses += len(missing)
            todo = list(missing.values())
            if isinstance(self.tokenizer, BatchTextTokenizer) and len(todo) > 1:
                encoded = self.tokenizer.encode_batch(todo)
            else:
                encoded = [self.tokenizer.encode(t) for t in todo]
            fresh = {key: tuple(ids) for key, ids in zip(missing, encoded)}
            for key, ids in fresh.items():  # (bounded: a batch over the bound keeps its last texts only)
                self._live[key] = ids
            self._dirty = True
            out = [fresh[k] if o is None else o for k, o in zip(keys, out)]
        self.hits += len(texts) - len(missing)
        return out  # type: ignore[return-value]

    def encode_chunked(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Like `encode_many`, but caches per chunk (see `chunks`): edits re-tokenize little."""
        split = [chunks(t) for t in texts]
        flat = self.encode_many([c for parts in split for c in parts])
        out: list[tuple[int, ...]] = []
        i = 0
        for parts in split:
            ids: list[int] = []
            for part in flat[i:i + len(parts)]:
                ids.extend(part)
            out.append(tuple(ids))
            i += len(parts)
        return out

    def count_chunked(self, texts: Sequence[str], keys: Sequence[bytes] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> list[int]:
        """Token counts of texts (as `encode_chunked`), without unpacking cached ids.

        Whole-text counts are remembered too, so a warm build neither splits nor unpacks.

        Args:
            texts: The texts.
            keys: Caller-made unique keys of the texts (default: their hashes).
            progress: Called as progress(texts counted, texts to count) after each batch of
                uncounted texts (`COUNT_BATCH_CHARS`); what it raises stops the count (the
                batches done stay cached).
        """
        keys = list(keys) if keys is not None else [text_key(t) for t in texts]
        known = [self._counts.get(k) for k in keys]
        todo = [(i, texts[i]) for i, c in enumerate(known) if c is None]
        done = 0
        for batch in _batches(todo, COUNT_BATCH_CHARS):
            for (i, _), count in zip(batch, self._count_chunks([text for _, text in batch])):
                known[i] = self._counts[keys[i]] = count
            self._dirty = True
            done += len(batch)
            if progress is not None:
                progress(done, len(todo))
        return known  # type: ignore[return-value]

    def _count_chunks(self, texts: Sequence[str]) -> list[int]:
        split = [chunks(t) for t in texts]
        counts: dict[bytes, int] = {}
        todo: list[str] = []
        for parts in split:
            for part in parts:
                key = text_key(part)
                if key in self._live:
                    counts[key] = len(self._live[key])
                elif key in self._stored:
                    counts[key] = len(self._stored[key]) // 4
                else:
                    todo.append(part)
        if todo:
            for part, ids in zip(todo, self.encode_many(todo)):
                counts[text_key(part)] = len(ids)
        self.hits += sum(len(p) for p in split) - len(todo)
        return [sum(counts[text_key(p)] for p in parts) for parts in split]

    def save(self) -> None:
        """Writes entries used in this session, then older ones up to a size cap."""
        if not self.persist or not self._dirty:
            return
        data: dict[bytes, bytes] = {k: self._stored.get(k) or _pack(v) for k, v in self._live.items()}
        total = sum(len(v) for v in data.values()) // 4
        for key, blob in self._stored.items():
            if key in data:
                continue
            total += len(blob) // 4
            if total > _MAX_SAVED_TOKENS:
                break
            data[key] = blob
        store.save(self.path, data)
        store.save(self._counts_path, self._counts)
        self._stored = data
        self._dirty = False
        log.debug("saved %d token entries to %s", len(data), self.path)
