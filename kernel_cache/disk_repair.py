"""Recovering a local tier whose index is damaged: read it from its value files, rebuild the index,
or wipe it so the space comes back (`cachectl list`, `verify --repair`, `clear`)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import diskcache

from . import entry as entry_format
from .disk_index import (
    ENTRIES_DIR,
    INDEX,
    INDEX_FILES,
    open_read_only,
    open_tree,
    value_files,
)
from .entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, Entry, check_key, is_key
from .errors import TierReadOnly
from .safefs import Owners
from .tier import no_lock
from .tiers.disk import DiskTier


class ValueFilesTier:
    """The local tier seen through its value files alone, for an operator when the index cannot
    be opened (damaged): list, show, export and prune still work (every value is a file; entries an
    older kernel-cache kept inside the index are not seen); `rebuild_index` restores the index itself."""

    name = "disk"
    writable = False

    def __init__(self, directory: Path, owners: Owners | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES):
        self.directory = Path(directory)
        self.max_entry_bytes = max_entry_bytes
        self.tree = open_tree(self.directory, owners, create=False)
        self._found: dict[str, tuple[tuple[str, str, str], dict[str, Any]]] = {}
        for parts in value_files(self.tree):
            try:
                found = self.tree.read(ENTRIES_DIR, *parts, max_bytes=max_entry_bytes,
                                       head=entry_format.META_PEEK_BYTES)
                if found is None:
                    continue
                head, st = found
                meta = entry_format.peek_meta_head(head, st.st_size)
            except (OSError, CorruptEntry):
                continue
            key = meta.get("key")
            if isinstance(key, str) and is_key(key):
                self._found[key] = (parts, {"key": key, "size_bytes": st.st_size,
                                            "created": _number(meta.get("created"), st.st_mtime),
                                            "last_used": st.st_mtime})

    def listing(self) -> list[dict[str, Any]]:
        return [dict(record) for _, record in self._found.values()]

    def peek_raw(self, key: str) -> bytes | None:
        if key not in self._found:
            return None
        found = self.tree.read(ENTRIES_DIR, *self._found[key][0], max_bytes=self.max_entry_bytes)
        return None if found is None else found[0]

    get_raw = peek_raw

    def get(self, key: str) -> Entry | None:
        data = self.peek_raw(check_key(key))
        return None if data is None else entry_format.decode(data, expected_key=key)

    def delete(self, key: str) -> bool:
        parts = self._found.pop(key, (None,))[0]
        return parts is not None and self.tree.unlink(ENTRIES_DIR, *parts)

    def __contains__(self, key: object) -> bool:
        return key in self._found

    def keys(self) -> Iterator[str]:
        return iter(list(self._found))

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[tuple[str, int]]:
        return []  # without an index nothing tells an orphan from an entry

    def quarantined(self) -> list[dict[str, Any]]:
        return []

    def touch(self, keys: Iterable[str]) -> None:
        pass  # read-only: recency is not recorded

    def flush_touches(self) -> None:
        pass

    def put_raw(self, key: str, data: bytes) -> None:
        raise TierReadOnly(f"the index of {self.directory} is damaged: run 'cachectl verify --repair'")

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        return no_lock(key, timeout)

    def close(self) -> None:
        self.tree.close()


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def rebuild_index(directory: Path, max_bytes: int = 8 << 30, *, owners: Owners | None = None,
                  max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> dict[str, Any]:
    """Replace a damaged index: move it aside, salvage the entries an older kernel-cache kept inside
    it (where SQLite can still read them), re-index every value file (each entry names its own key;
    unreadable ones are removed). Returns what was found, rebuilt and lost: `lost` are keys the damaged
    index still listed that no file or readable row holds; `listed` is None when nothing in it could be
    read (then what it listed is unknown)."""
    tree = open_tree(Path(directory), owners, create=False)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    listed, salvaged = _read_damaged_index(Path(directory) / ENTRIES_DIR / INDEX)
    for name in INDEX_FILES:
        with contextlib.suppress(OSError):
            tree.rename((ENTRIES_DIR, name), (ENTRIES_DIR, f"{name}.damaged-{stamp}"))
    tier = DiskTier(directory, max_bytes, owners=owners, max_entry_bytes=max_entry_bytes)
    recovered = removed = files = 0
    try:
        now = time.time()
        for parts in list(value_files(tier.tree)):
            files += 1
            try:
                found = tier.tree.read(ENTRIES_DIR, *parts, max_bytes=max_entry_bytes)
                data = found[0] if found is not None else b""
                key = check_key(entry_format.decode(data).key)
            except (CorruptEntry, OSError, ValueError):
                tier.tree.unlink(ENTRIES_DIR, *parts)
                removed += 1
                continue
            if key not in tier:
                tier.index_value_file(key, parts, len(data), now)
                recovered += 1
        for key, value in salvaged:  # written to files now: the index holds no values
            try:
                entry_format.decode(value, expected_key=key)
            except CorruptEntry:
                removed += 1
                continue
            if key not in tier:
                tier.put_raw(key, value)
                recovered += 1
        lost = sorted(key for key in (listed or ()) if key not in tier)
    finally:
        tier.close()
        tree.close()
    return {"value_files": files, "recovered": recovered, "removed": removed, "listed": len(listed)
            if listed is not None else None, "lost": lost, "moved_aside": f"{INDEX}.damaged-{stamp}"}


def _read_damaged_index(db: Path) -> tuple[set[str] | None, list[tuple[str, bytes]]]:
    """The keys a damaged index still lists and the values kept inside it, as far as SQLite can read
    them (row by row: a truncated file yields its first pages); (None, []) when none can be read."""
    listed: set[str] | None = None
    salvaged: list[tuple[str, bytes]] = []
    try:
        old = open_read_only(db, 5.0)
    except (sqlite3.Error, OSError):
        return None, []
    with contextlib.closing(old):
        try:
            rows = old.execute("SELECT key, mode, value FROM Cache WHERE raw = 1")
            listed = set()
            for key, mode, value in rows:
                if isinstance(key, str) and is_key(key):
                    listed.add(key)
                    if mode == diskcache.core.MODE_RAW and isinstance(value, bytes):
                        salvaged.append((key, value))
        except (sqlite3.Error, OSError):
            pass  # read up to the damage
    return listed, salvaged


def wipe(directory: Path, owners: Owners | None = None) -> int:
    """Remove the index and every value file even when the index cannot be opened (damaged, or a
    full disk): `cachectl clear` must always be able to free the space. Returns files removed."""
    tree = open_tree(Path(directory), owners, create=False)
    removed = 0
    try:
        for parts in list(value_files(tree)):
            removed += tree.unlink(ENTRIES_DIR, *parts)
        for name in INDEX_FILES:
            removed += tree.unlink(ENTRIES_DIR, name)
    finally:
        tree.close()
    return removed
