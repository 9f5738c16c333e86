"""The interfaces of the store's levels: `Level`, the data path every level has, and `KeptLevel`, a
level that also keeps entries beyond this process and answers the maintenance an operator's tools
use (asked with isinstance, never by probing for methods). A level describes itself (`name`,
`location`, `mode`, `writable`).

Persistent levels keep bytes in the entry format and validate keys at their door (`entry.check_key`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kernel_cache.entries.entry import Entry


class FrontLevel(Protocol):
    """What the store asks of the warm set read before its levels (`kernel_cache.front_level`, which
    imports the store: named here, the store imports nothing above it)."""

    level: str  # the level its members are served from, as the stats name it

    def front_get(self, key: str) -> Entry | None: ...


@runtime_checkable
class Level(Protocol):
    """The data path every level has: read, write, ask, and take the per-key lock."""

    @property
    def name(self) -> str:
        """'memory', 'disk', 'job', 'shared', 'remote'."""

    @property
    def writable(self) -> bool:
        """False while writes are refused (read-only mount, full disk, a remote cooling down): puts are skipped."""

    @property
    def location(self) -> str:
        """Where it lives, for messages: a directory, an endpoint (never a password), "this process"."""

    @property
    def mode(self) -> str:
        """How it is used now: "read-write", "read-only", "read-only (replica)", "skipped (server failing)"."""

    def get(self, key: str) -> Entry | None:
        """The valid entry, or None. Raises CorruptEntry (damaged: removed or quarantined) or
        RejectedEntry (not authenticated: left in place)."""

    def keep(self, entry: Entry, data: bytes) -> None:
        """Keep `entry`, whose bytes as the store writes them are `data`: a persistent level writes
        `data` (`put_raw`), the memory level keeps the decoded entry."""

    def __contains__(self, key: object) -> bool: ...

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool | None]:
        """Single-flight across processes: True when held, False when a wait for its holder ended
        otherwise, None when it could not be taken and nobody holds it (the level failed): compile."""

    def close(self) -> None: ...


@runtime_checkable
class KeptLevel(Level, Protocol):
    """A level that keeps entries beyond this process: what `cachectl` lists, verifies and prunes,
    and what the LRU order is told of."""

    @property
    def directory(self) -> Path | None:
        """Where it lives (None: not on a filesystem)."""

    def delete(self, key: str) -> bool: ...

    def listing(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created, last_used (epoch seconds), without reading blobs."""

    def put_raw(self, key: str, data: bytes) -> None:
        """Store encoded (possibly signed) entry bytes."""

    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes without counting as a use of the entry."""

    def touch(self, keys: Iterable[str]) -> None:
        """Count a use of these entries for the LRU order without reading them (a lowered-call
        record served their kernels); deferred until `flush_touches`."""

    def flush_touches(self) -> None:
        """Write the uses `get` and `touch` deferred (at the next write, at close, at exit)."""

    def remove_debris(self, older_than_seconds: float) -> list[tuple[str, int]]:
        """Files crashed writers left behind, removed: [(path, bytes)]."""

    def quarantined(self) -> list[dict[str, Any]]:
        """Entries moved aside as bad (path, key, size_bytes, quarantined_at); [] if none kept."""


def holds(level: Level, key: str) -> bool:
    """Whether `level` holds `key`, without reading it (a stat, EXISTS); a level that cannot say does not."""
    try:
        return key in level
    except Exception:
        return False
