"""`LRUDict`: a mapping that forgets its least recently used entries past a size cap.

Caches that grow with every edit, question or file version (token ids, hover answers,
conversations) use it, so a long session or a client sending endless new keys cannot
grow the server's memory without bound.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Iterator, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUDict(Generic[K, V]):
    """Entries up to a total weight; reading or writing an entry makes it the most recent.

    Args:
        capacity: The most total weight kept (at least the newest entry is always kept).
        weight: An entry's weight (default 1: `capacity` counts entries).
    """

    def __init__(self, capacity: int, weight: Callable[[V], int] | None = None) -> None:
        self.capacity = capacity
        self._weight = weight or (lambda value: 1)
        self._items: OrderedDict[K, V] = OrderedDict()
        self.total = 0
        self.evicted = 0

    def get(self, key: K, default: V | None = None) -> V | None:
        if key not in self._items:
            return default
        self._items.move_to_end(key)
        return self._items[key]

    def __getitem__(self, key: K) -> V:
        self._items.move_to_end(key)
        return self._items[key]

    def __setitem__(self, key: K, value: V) -> None:
        if key in self._items:
            self.total -= self._weight(self._items.pop(key))
        self._items[key] = value
        self.total += self._weight(value)
        while self.total > self.capacity and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.total -= self._weight(old)
            self.evicted += 1

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def items(self):
        return self._items.items()

    def pop(self, key: K, default: V | None = None) -> V | None:
        if key not in self._items:
            return default
        value = self._items.pop(key)
        self.total -= self._weight(value)
        return value

    def clear(self) -> None:
        self._items.clear()
        self.total = 0
