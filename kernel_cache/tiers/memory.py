"""In-process LRU tier (kernel_cache.lru), bounded by total bytes and by item count. Thread-safe.

It keeps decoded entries (a hit costs a dict lookup) and answers the Tier protocol's maintenance
calls with nothing: no records, no lock, no debris, no quarantine.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from .. import entry as entry_format
from ..entry import Entry
from ..lru import SizedLRU
from ..tier import no_lock


class MemoryTier:
    name = "memory"
    directory = None
    writable = True

    def __init__(self, max_bytes: int = 256 << 20, max_items: int = 4096):
        self._lru: SizedLRU[Entry] = SizedLRU(lambda entry: entry.size, max_bytes, max_items)
        self.get: Callable[[str], Entry | None] = self._lru.get  # a hit is the LRU's lookup, no wrapper

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes

    @property
    def max_items(self) -> int | None:
        return self._lru.max_items

    def put(self, entry: Entry) -> None:
        self._lru.put(entry.key, entry, entry.size)

    def delete(self, key: str) -> bool:
        return self._lru.delete(key)

    def clear(self) -> None:
        self._lru.clear()

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        return self._lru.bytes

    # The rest of the Tier protocol ------------------------------------------------------------
    def put_raw(self, key: str, data: builtins.bytes) -> None:
        self.put(entry_format.decode(data, expected_key=key))

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    def listing(self) -> list[dict[str, Any]]:
        return []

    def peek_raw(self, key: str) -> builtins.bytes | None:
        return None

    def touch(self, keys: Iterable[str]) -> None:
        pass  # a process-private LRU: what it does not hold needs no recency

    def flush_touches(self) -> None:
        pass

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        return no_lock(key, timeout)

    def remove_debris(self, older_than_seconds: float = 0.0) -> list[tuple[str, int]]:
        return []

    def quarantined(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        self.clear()
