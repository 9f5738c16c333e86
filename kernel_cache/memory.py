"""In-process LRU tier, bounded by total bytes and by item count. Thread-safe.

It keeps decoded entries (a hit costs a dict lookup) and answers the Tier protocol's maintenance
calls with nothing: no records, no lock, no debris, no quarantine.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
from collections import OrderedDict
from typing import Any

from . import entry as entry_format
from .entry import Entry
from .tier import no_lock


class MemoryTier:
    name = "memory"
    directory = None
    writable = True

    def __init__(self, max_bytes: int = 256 << 20, max_items: int = 4096):
        self.max_bytes = max_bytes
        self.max_items = max_items
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> Entry | None:
        with self._lock:
            entry = self._items.get(key)
            if entry is not None:
                self._items.move_to_end(key)
            return entry

    def put(self, entry: Entry) -> None:
        size = entry.size
        if size > self.max_bytes or self.max_items <= 0:
            return  # larger than the whole tier: keeping it would evict everything else
        with self._lock:
            old = self._items.pop(entry.key, None)
            if old is not None:
                self._bytes -= old.size
            self._items[entry.key] = entry
            self._bytes += size
            while self._items and (self._bytes > self.max_bytes or len(self._items) > self.max_items):
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.size

    def delete(self, key: str) -> bool:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            return old is not None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    # The rest of the Tier protocol ------------------------------------------------------------
    def put_raw(self, key: str, data: builtins.bytes) -> None:
        self.put(entry_format.decode(data, expected_key=key))

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def records(self) -> list[dict[str, Any]]:
        return []

    def peek_raw(self, key: str) -> builtins.bytes | None:
        return None

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        return no_lock(key, timeout)

    def remove_debris(self, older_than_seconds: float = 0.0) -> list[tuple[str, int]]:
        return []

    def quarantined(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        self.clear()
