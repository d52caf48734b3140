"""Reading the archive's files: ahead of the caller on helper threads, and other policies' indexes.

A restart restores a long prefix from many checkpoint files (66 files, 32 GiB for 128k
tokens of a Qwen3-32B-shaped model). Read one after the other, the disk waits while the
engine checks and copies each file, and the engine waits while the disk reads the next.
`read_ahead` keeps the next files' reads under way on helper threads (two at a time by
default; whether two beat one on the H200's disk is not measured yet) while the caller
checks and copies the current one; bounded, so only a few files wait in memory. Only bytes
cross the threads: everything MLX does stays on the caller's thread.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

import msgpack

from engine.archive_files import is_plain_policy, read_regular

INDEX_NAME = "index.msgpack"
MAX_INDEX_BYTES = 256 << 20  # an index this large was not written by the engine

T = TypeVar("T")


def read_ahead(items: Sequence[T], read: Callable[[T], bytes], depth: int = 3,
               workers: int = 2) -> Iterator[tuple[T, bytes | Exception]]:
    """`(item, read(item))` in order, the reads of the next `depth` items under way meanwhile
    (`workers` of them at a time): at most `depth + 2` items' bytes in memory with the caller's.

    A read that fails yields its exception in place of the bytes (the caller decides); reads
    not yet consumed when the caller stops are cancelled or left to finish unseen.
    """
    if not items:
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="codectx-archive-read")
    pending: list[tuple[T, Future]] = []
    queued = 0
    try:
        for _ in range(len(items)):
            while queued < len(items) and len(pending) <= depth:
                pending.append((items[queued], pool.submit(read, items[queued])))
                queued += 1
            item, future = pending.pop(0)
            try:
                data: bytes | Exception = future.result()
            except Exception as err:  # noqa: BLE001 - handed to the caller, which treats it as a bad entry
                data = err
            yield item, data
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def other_policy_has(root: Path, policy_fingerprint: str, token_key: str) -> bool:
    """True if a policy directory beside `policy_fingerprint`'s under `root` archived the tokens of `token_key`.

    Looks only at plain-named real directories and at their regular-file indexes;
    anything unreadable counts as not archived.
    """
    try:
        with os.scandir(root) as scan:
            others = [d.path for d in scan if d.name != policy_fingerprint
                      and is_plain_policy(d.name) and d.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    for directory in others:
        try:
            raw = msgpack.unpackb(read_regular(Path(directory) / INDEX_NAME, MAX_INDEX_BYTES), raw=False)
            entries = raw["entries"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException):
            continue
        if any(isinstance(e, dict) and e.get("token_key") == token_key for e in entries):
            return True
    return False
