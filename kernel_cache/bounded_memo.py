"""The floors' memos: `BoundedMemo`, a dict of pure values that stops growing at its bound, and
`SizedLRU`, an LRU bounded by total bytes (the memory level's, and the lowering's compressed runs and
whole call payloads)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(dict[K, V]):
    """A memo of pure values that stops growing at `bound` entries (`BoundedMemo.of(n)` for another):
    what comes later is computed again at each ask, so a long-running server tracing new programs
    holds a bounded amount. Reads and making one are a plain dict's (no Python `__init__`)."""

    __slots__ = ()
    bound = 4096

    @classmethod
    def of(cls, bound: int) -> BoundedMemo[Any, Any]:
        sized: type[BoundedMemo[Any, Any]] = type(f"BoundedMemo{bound}", (cls,), {"__slots__": (), "bound": bound})
        return sized()

    def remember(self, key: K, value: V) -> V:
        """Keep `value` under `key` while below the bound; `value` either way."""
        if len(self) < self.bound:
            self[key] = value
        return value


class SizedLRU(Generic[V]):
    """`size(value)` counts against `max_bytes`; a value larger than `max_item_bytes` (default: the
    whole bound) is not kept. Sizes are kept beside the values."""

    def __init__(self, size: Callable[[V], int], max_bytes: int, max_items: int | None = None,
                 max_item_bytes: int | None = None) -> None:
        self._size = size
        self.max_bytes = max_bytes
        self.max_items = max_items
        self._max_item_bytes = max_bytes if max_item_bytes is None else max_item_bytes
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def of_bytes(cls, max_bytes: int) -> "SizedLRU[bytes]":
        """An LRU of bytes values, sized by length; one over a quarter of the bound is not kept."""
        return SizedLRU(len, max_bytes, max_item_bytes=max_bytes // 4)

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: V, size: int | None = None) -> None:
        size = self._size(value) if size is None else size  # a caller that knows it saves a call
        if size > self._max_item_bytes or (self.max_items is not None and self.max_items <= 0):
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            while self._items and (self._bytes > self.max_bytes or
                                   (self.max_items is not None and len(self._items) > self.max_items)):
                _, (_, evicted) = self._items.popitem(last=False)
                self._bytes -= evicted

    def delete(self, key: Hashable) -> bool:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            return old is not None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    @property
    def bytes(self) -> int:
        return self._bytes
