"""The one interface every tier implements (memory, local disk, shared directory, and any future
remote tier), so the store walks them in order and cachectl never probes for methods.

A tier stores entries by content key. Persistent tiers keep bytes in the entry format; the memory
tier keeps decoded entries and answers the maintenance calls with nothing (no records, no lock,
no debris). Keys are validated at every persistent tier's door (`entry.check_key`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .entry import Entry


@runtime_checkable
class Tier(Protocol):
    @property
    def name(self) -> str:
        """'memory', 'disk', 'shared': what stats and listings call it."""

    @property
    def directory(self) -> Path | None:
        """Where it lives (None: in this process)."""

    @property
    def writable(self) -> bool:
        """False while writes are refused (read-only mount, full disk, busy index): puts are skipped."""

    def get(self, key: str) -> Entry | None:
        """The valid entry, or None. Raises CorruptEntry (damaged: removed or quarantined) or
        RejectedEntry (not authenticated: left in place)."""

    def put_raw(self, key: str, data: bytes) -> None:
        """Store encoded (possibly signed) entry bytes."""

    def delete(self, key: str) -> bool: ...

    def __contains__(self, key: object) -> bool: ...

    def records(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created, last_used (epoch seconds), without reading blobs."""

    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes without counting as a use of the entry."""

    def touch(self, keys: Iterable[str]) -> None:
        """Count a use of these entries for the LRU order without reading them (a lowered-call
        record served their kernels); deferred until `flush_touches`."""

    def flush_touches(self) -> None:
        """Write the uses `get` and `touch` deferred (at the next write, at close, at exit)."""

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        """Single-flight across processes: True when held, False when the wait ended otherwise."""

    def remove_debris(self, older_than_seconds: float) -> list[tuple[str, int]]:
        """Files crashed writers left behind, removed: [(path, bytes)]."""

    def quarantined(self) -> list[dict[str, Any]]:
        """Entries moved aside as bad (path, key, size_bytes, quarantined_at); [] if none kept."""

    def close(self) -> None: ...


@contextlib.contextmanager
def no_lock(key: str, timeout: float) -> Iterator[bool]:
    """The lock of a tier that is private to this process: nothing to wait for."""
    yield True
