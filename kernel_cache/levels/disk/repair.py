"""Recovering a local level whose index is damaged: read it from its value files, rebuild the index
(`disk_rebuild`), or wipe it so the space comes back (`cachectl list`, `verify --repair`, `clear`),
and heal it when a process opens it (`open_healed`, which the store calls): one process rebuilds,
under the index lock, while the others wait a bounded time for it, then use the rebuilt index (or,
still waiting, read the entry files meanwhile). The damaged index is read as far as it goes, to
say which of the entries it listed are lost."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kernel_cache.coordination import locks
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, Entry, check_key, is_key
from kernel_cache.errors import IndexDamaged, LevelReadOnly, LevelUnavailable
from kernel_cache.levels.disk import level as disk
from kernel_cache.levels.disk import rebuild as disk_rebuild
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import (
    ENTRIES_DIR,
    ENTRIES_FILES,
    INDEX,
    INDEX_LOCK,
    LOCKS_DIR,
    describe_error,
    open_tree,
    value_files,
)
from kernel_cache.levels.protocols import InDirectory, Level, no_lock
from kernel_cache.settings.config import Config
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.safefs import Owners, Tree


class ValueFilesLevel(InDirectory):
    """The local level seen through its value files alone, for an operator when the index cannot
    be opened (damaged): list, show, export and prune still work (every value is a file);
    `rebuild_index` restores the index itself."""

    name = "disk"
    writable = False
    mode = "read-only (its index damaged)"

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

    def keep(self, entry: Entry, data: bytes) -> None:
        self.put_raw(entry.key, data)

    def put_raw(self, key: str, data: bytes) -> None:
        raise LevelReadOnly(f"the index of {self.directory} is damaged: run 'cachectl verify --repair'")

    def lock(self, key: str, timeout: float) -> contextlib.AbstractContextManager[bool]:
        return no_lock(key, timeout)

    def close(self) -> None:
        self.tree.close()


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def rebuild_index(directory: Path, max_bytes: int = 8 << 30, *, owners: Owners | None = None,
                  max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, wait: float = 30.0) -> dict[str, Any]:
    """Replace a damaged index (`cachectl verify --repair`): under the index lock (waiting at most
    `wait` seconds for a process rebuilding it, else LevelUnavailable), see `_rebuild`."""
    tree = open_tree(Path(directory), owners, create=False)
    try:
        with locks.hold(tree, (LOCKS_DIR, INDEX_LOCK), "flock", wait) as held:
            if not held:
                raise LevelUnavailable(f"another process has been rebuilding the index of {directory} for "
                                      f"{wait:.0f} s; try again once it is done")
            return _rebuild(tree, Path(directory), max_bytes, max_entry_bytes, wait)
    finally:
        tree.close()


def open_healed(config: Config, owners: Owners, damage: IndexDamaged) -> tuple[Level, dict[str, Any] | None]:
    """The local level of `config` whose index `damage` says is damaged, healed: under the index lock
    the index is rebuilt from the entry files (or found rebuilt by the neighbour that held the lock),
    one warning saying so; returns the level and the rebuild's report (None: not rebuilt here). A
    neighbour rebuilding for longer than `config.index_timeout`, or a rebuild that fails (a read-only
    mount), leaves the entry files served read-only meanwhile, one warning saying so. Raises `damage`
    when not even the files can be read."""
    directory = Path(config.dir or ".")
    reason = ""
    try:
        tree = open_tree(directory, owners, create=False)
        try:
            with locks.hold(tree, (LOCKS_DIR, INDEX_LOCK), "flock", config.index_timeout) as held:
                if held:
                    return _heal_holding_the_lock(tree, config, owners, damage)
        finally:
            tree.close()
        reason = (f"another process is rebuilding it (waited {config.index_timeout:.0f} s): serving its entry "
                  f"files meanwhile")
    except (OSError, sqlite3.Error) as exc:
        reason = (f"it could not be rebuilt here ({describe_error(exc)}): serving its entry files; "
                  f"'cachectl verify --repair' rebuilds it")
    try:
        files = ValueFilesLevel(directory, owners, config.max_entry_bytes)
    except Exception:
        raise damage from None
    warn_once(f"disk-index-damaged:{directory}", f"{damage.problem}: {reason}, new kernels stay in memory")
    return files, None


def _heal_holding_the_lock(tree: Tree, config: Config, owners: Owners,
                           damage: IndexDamaged) -> tuple[Level, dict[str, Any] | None]:
    directory = Path(config.dir or ".")
    try:
        return _open_local(config, owners), None  # a neighbour rebuilt it while we waited
    except IndexDamaged:
        pass
    report = _rebuild(tree, directory, config.max_bytes, config.max_entry_bytes, config.index_timeout)
    report["problem"] = damage.problem
    aside = f"; the damaged index is kept as entries/{report['moved_aside']}" if report["moved_aside"] else ""
    warn_once(f"disk-index-rebuilt:{directory}",
              f"{report['problem']}: rebuilt it from its {report['value_files']} entry files ({report['recovered']} "
              f"entries re-indexed, {report['removed']} unreadable removed, {len(report['lost'])} lost){aside}")
    return _open_local(config, owners), report


def _open_local(config: Config, owners: Owners) -> Level:
    level = disk.open_from_config(config, owners, None, False)
    if level is None:
        raise LevelUnavailable("no local cache directory is configured")
    return level


def _rebuild(tree: Tree, directory: Path, max_bytes: int, max_entry_bytes: int, timeout: float) -> dict[str, Any]:
    """Rebuild the index, the index lock held: every value file indexed (each entry names its own
    key; unreadable ones are removed) in a new index put in place of the damaged one, which is kept
    aside under a stamped name (`disk_rebuild.build`). Returns what was found, rebuilt and lost:
    `lost` are keys the damaged index still listed that no file holds; `listed` is None when nothing
    in it could be read (then what it listed is unknown)."""
    listed = _read_damaged_index(directory / ENTRIES_DIR / INDEX)
    built = disk_rebuild.build(tree, directory, max_bytes, max_entry_bytes, timeout)
    return {"value_files": built["value_files"], "recovered": len(built["keys"]), "removed": built["removed"],
            "listed": len(listed) if listed is not None else None,
            "lost": sorted(key for key in (listed or ()) if key not in built["keys"]),
            "moved_aside": built["moved_aside"]}


def _read_damaged_index(db: Path) -> set[str] | None:
    """The keys a damaged index still lists, as far as SQLite can read them (row by row: a truncated
    file yields its first pages); None when none can be read."""
    try:
        old = disk_sql.open_read_only(db, 5.0)
    except (sqlite3.Error, OSError):
        return None
    listed: set[str] | None = None
    with contextlib.closing(old):
        try:
            rows = disk_sql.keys(old)
            listed = set()
            for key in rows:
                if isinstance(key, str) and is_key(key):
                    listed.add(key)
        except (sqlite3.Error, OSError):
            pass  # read up to the damage
    return listed


def wipe(directory: Path, owners: Owners | None = None) -> int:
    """Remove the index and every value file even when the index cannot be opened (damaged, or a
    full disk): `cachectl clear` must always be able to free the space. Returns files removed."""
    tree = open_tree(Path(directory), owners, create=False)
    removed = 0
    try:
        for parts in list(value_files(tree)):
            removed += tree.unlink(ENTRIES_DIR, *parts)
        for name in ENTRIES_FILES:
            removed += tree.unlink(ENTRIES_DIR, name)
    finally:
        tree.close()
    return removed
