"""The in-process level: an LRU bounded by total bytes and by item count, of decoded entries (a hit
costs a dict lookup). It keeps nothing beyond this process: no maintenance to answer.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable

from kernel_cache.bounded_memo import SizedLRU
from kernel_cache.entries.entry import Entry


class MemoryLevel:
    name = "memory"
    location = "this process"
    mode = "read-write"
    writable = True

    def __init__(self, max_bytes: int = 256 << 20, max_items: int = 4096):
        self._lru: SizedLRU[Entry] = SizedLRU(_entry_size, max_bytes, max_items)
        self.get: Callable[[str], Entry | None] = self._lru.get  # a hit is the LRU's lookup, no wrapper

    def put(self, entry: Entry) -> None:
        if entry.stored is not None:  # its blobs are what a hit needs: not the bytes they came from too
            entry = Entry(entry.key, entry.meta, entry.blobs)
        self._lru.put(entry.key, entry, _entry_size(entry))

    def keep(self, entry: Entry, data: builtins.bytes) -> None:
        self.put(entry)

    def delete(self, key: str) -> bool:
        return self._lru.delete(key)

    def clear(self) -> None:
        self._lru.clear()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    @property
    def bytes(self) -> int:
        return self._lru.bytes

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        return contextlib.nullcontext(True)  # private to this process: nothing to wait for

    def close(self) -> None:
        self.clear()


def _entry_size(entry: Entry) -> int:
    """`Entry.size`, here: a memory insert stays within this file."""
    return sum(len(blob) for blob in entry.blobs.values())
