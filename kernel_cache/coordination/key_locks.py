"""Per-key thread locks for the store's single-flight: one build per key at a time in a process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from kernel_cache.errors import ReentrantBuild
from kernel_cache.telemetry import lookup_log


class KeyLocks:
    """An entry lives only while some thread holds or waits for it; a thread that asks for a key it
    is already building gets ReentrantBuild instead of waiting on itself forever."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, list[Any]] = {}  # key -> [lock, users, owning thread id]

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.contextmanager
    def hold(self, key: str, label: lookup_log.Label = "") -> Iterator[None]:
        me = threading.get_ident()
        with self._guard:
            slot = self._locks.get(key)
            if slot is not None and slot[2] == me:
                raise ReentrantBuild(f"the builder of {lookup_log.label_text(label, 'kernel')} ({key[:12]}) asked "
                                     f"the store for the same key while building it; it would wait on itself "
                                     f"forever")
            if slot is None:
                slot = self._locks[key] = [threading.Lock(), 0, None]
            slot[1] += 1
        try:
            with slot[0]:
                slot[2] = me
                try:
                    yield
                finally:
                    slot[2] = None
        finally:
            with self._guard:
                slot[1] -= 1
                if slot[1] == 0:
                    del self._locks[key]
