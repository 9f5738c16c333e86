"""Cache directories an older kernel-cache wrote, read once through diskcache's public API.

An older kernel-cache indexed the local level with diskcache (entries/cache.db) and kept its counters
in another diskcache index (stats/cache.db); some of its entries (those under 32 KiB, in the oldest
versions) lived inside entries/cache.db rather than in value files. The first process that opens
such a directory for writing upgrades it (`upgrade`, under the index lock): those inline entries are
written as value files, our own index (`disk_sql`) is built from every value file (`disk_rebuild`),
then entries/cache.db and its journal files are removed. The counters' table imports the older
counters the same way (`counters`).

This is the one module that imports diskcache. It reads diskcache's indexes through its public API
alone (`Cache`, `iterkeys`, `get`) with `RawOnlyDisk`, a `diskcache.Disk` (diskcache's documented
extension point for (de)serialisation) that never unpickles: a pickled or text row (not written by
kernel-cache) is refused, never loaded, and a value kept in a file is answered as None, its file
never opened by diskcache (`disk_rebuild` reads it through `safefs`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diskcache

from kernel_cache.coordination import locks
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry, is_key
from kernel_cache.errors import LevelUnavailable
from kernel_cache.levels.disk import rebuild as disk_rebuild
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import (
    ENTRIES_DIR,
    INDEX,
    INDEX_LOCK,
    LOCKS_DIR,
    OLD_INDEX,
    OLD_INDEX_FILES,
    check_file,
)
from kernel_cache.trust.safefs import Tree

_NOT_RAW_KEY = "<a key kernel-cache did not write>"


class RawOnlyDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no types
    """diskcache's (de)serializer without pickle: keys and values are stored raw; a row stored any
    other way (pickle, text) was not written by kernel-cache and is never deserialized. Only inline
    raw values are fetched: a value kept in a file is None (its file is never opened here)."""

    def get(self, key: Any, raw: bool) -> Any:
        return super().get(key, raw) if raw else _NOT_RAW_KEY

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if read or not isinstance(value, (bytes, int)) or isinstance(value, bool):
            raise TypeError("kernel-cache stores only bytes and integers in its index")
        return super().store(value, read, key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == diskcache.core.MODE_RAW:
            return bytes(value) if isinstance(value, (bytes, memoryview)) else value
        if mode == diskcache.core.MODE_BINARY and not read:
            return None
        raise CorruptEntry("not an inline raw value or a value file: pickle and text rows are never loaded")


def upgrade(tree: Tree, directory: Path, max_bytes: int, max_entry_bytes: int, timeout: float,
            write_value_file: Callable[[Tree, bytes], object]) -> dict[str, Any]:
    """Upgrade the directory (see the module's docstring), its inline entries written as value files
    by `write_value_file` (the level's own), waiting at most `timeout` for a neighbour
    upgrading it (LevelUnavailable after). Returns `imported` (inline entries written as files) and
    `indexed` (entries in the new index); both None where a neighbour upgraded it meanwhile. Raises
    (the directory left as it was, the upgrade tried again later) where diskcache's index is busy."""
    with locks.hold(tree, (LOCKS_DIR, INDEX_LOCK), "flock", timeout) as held:
        if not held:
            raise LevelUnavailable(f"another process has been upgrading the index of {directory} for {timeout:.0f} s")
        report: dict[str, Any] = {"imported": None, "indexed": None}
        if tree.lstat(ENTRIES_DIR, INDEX) is None:
            try:
                report["imported"] = _import_inline(tree, directory, max_entry_bytes, timeout, write_value_file)
            except diskcache.Timeout:
                raise LevelUnavailable(f"the older index of {directory} is held by another process") from None
            report["indexed"] = len(disk_rebuild.build(tree, directory, max_bytes, max_entry_bytes, timeout,
                                                       whole=False)["keys"])
        for name in OLD_INDEX_FILES:  # (after a neighbour's upgrade that died before this: nothing left to import)
            tree.unlink(ENTRIES_DIR, name)
    return report


def _import_inline(tree: Tree, directory: Path, max_entry_bytes: int, timeout: float,
                   write_value_file: Callable[[Tree, bytes], object]) -> int:
    """Write each valid entry diskcache's index keeps inside itself as a value file; how many. An
    index too damaged to read gives none (its value files are indexed all the same)."""
    if check_file(tree, ENTRIES_DIR, OLD_INDEX) is None:
        return 0
    for name in OLD_INDEX_FILES[1:]:
        check_file(tree, ENTRIES_DIR, name)
    imported = 0
    try:
        with contextlib.closing(_open(directory / ENTRIES_DIR, timeout)) as old:
            for key in old.iterkeys():
                if not (isinstance(key, str) and is_key(key)):
                    continue
                try:
                    value = old.get(key, retry=False)
                    if not isinstance(value, bytes) or len(value) > max_entry_bytes:
                        continue  # kept in a value file (indexed with the others), or not an entry
                    entry_format.decode(value, expected_key=key)
                except CorruptEntry:
                    continue  # a pickled or text row, or a damaged entry: never loaded, left behind
                write_value_file(tree, value)
                imported += 1
    except sqlite3.DatabaseError as exc:
        if not disk_sql.is_damage(exc):
            raise
    return imported


def counters(stats_dir: Path, timeout: float) -> dict[str, int]:
    """The integer counters of the diskcache index an older kernel-cache kept in `stats_dir`; none
    where there is no such index or it cannot be read (counters are best effort)."""
    if not (stats_dir / OLD_INDEX).is_file():
        return {}
    found: dict[str, int] = {}
    try:
        with contextlib.closing(_open(stats_dir, timeout)) as old:
            for key in old.iterkeys():
                try:  # RawOnlyDisk refuses a pickled or text row: that counter only is left behind
                    value = old.get(key, retry=False) if isinstance(key, str) else None
                except Exception:
                    continue
                if isinstance(value, int) and not isinstance(value, bool):
                    found[key] = value
    except Exception:
        return {}
    return found


def _open(directory: Path, timeout: float) -> diskcache.Cache:
    """diskcache's index in `directory`, its opening bounded by `timeout`: diskcache's own set-up
    retries each statement for 60 s, so a neighbour's write transaction is waited out first."""
    con = sqlite3.connect(str(directory / OLD_INDEX), timeout=timeout, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
    finally:
        con.close()
    return diskcache.Cache(str(directory), timeout=timeout, disk=RawOnlyDisk, eviction_policy="none")
