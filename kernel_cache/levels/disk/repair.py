"""Recovering a local level whose index is damaged: read it from its value files, rebuild the index,
or wipe it so the space comes back (`cachectl list`, `verify --repair`, `clear`), and heal it when a
process opens it (`open_healed`, which the store calls): one process rebuilds, under the index lock,
while the others wait a bounded time for it, then use the rebuilt index (or, still waiting, read the
entry files meanwhile).

This module is long because the rebuild is done once for all of them: the damaged index read as far
as it goes, the new one built aside and put in place in one rename, the damaged one kept."""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import diskcache

from kernel_cache.coordination import locks
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, Entry, check_key, is_key
from kernel_cache.errors import IndexDamaged, LevelReadOnly, LevelUnavailable
from kernel_cache.level import InDirectory, Level, no_lock
from kernel_cache.levels.disk import level as disk
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import (
    ENTRIES_DIR,
    INDEX,
    INDEX_FILES,
    INDEX_LOCK,
    LOCKS_DIR,
    describe_error,
    open_index,
    open_tree,
    value_files,
)
from kernel_cache.levels.disk.level import DiskLevel
from kernel_cache.settings.config import Config
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.safefs import Owners, Tree


class ValueFilesLevel(InDirectory):
    """The local level seen through its value files alone, for an operator when the index cannot
    be opened (damaged): list, show, export and prune still work (every value is a file; entries an
    older kernel-cache kept inside the index are not seen); `rebuild_index` restores the index itself."""

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
            return _rebuild(tree, Path(directory), max_bytes, owners, max_entry_bytes)
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
    except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
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
    report = _rebuild(tree, directory, config.max_bytes, owners, config.max_entry_bytes, config.index_timeout)
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


def _rebuild(tree: Tree, directory: Path, max_bytes: int, owners: Owners | None, max_entry_bytes: int,
             timeout: float = 30.0) -> dict[str, Any]:
    """Rebuild the index, the index lock held: salvage the entries an older kernel-cache kept inside
    the damaged one (where SQLite can still read them), index every value file (each entry names its
    own key; unreadable ones are removed) in a new index built aside, then put it in place in one
    rename, the damaged one kept aside under a stamped name: a process opening the index meanwhile
    sees the damaged one (and waits for the lock) or the whole new one, never a part. Returns what
    was found, rebuilt and lost: `lost` are keys the damaged index still listed that no file or
    readable row holds; `listed` is None when nothing in it could be read (then what it listed is
    unknown)."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    listed, salvaged = _read_damaged_index(directory / ENTRIES_DIR / INDEX)
    for name, st in tree.listdir(ENTRIES_DIR):  # what a rebuild that died left (the lock is ours)
        if name.startswith(_SCRATCH) and stat.S_ISDIR(st.st_mode):
            tree.remove_tree(ENTRIES_DIR, name)
    scratch = f"{_SCRATCH}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with tree.directory(ENTRIES_DIR, scratch, create=True):
            pass
        open_index(directory / ENTRIES_DIR / scratch, timeout, **disk.index_settings(max_bytes)).close()
        new = directory / ENTRIES_DIR / scratch / INDEX  # diskcache's tables, settings and triggers
        with disk_sql.writing(new, timeout) as con:
            files, recovered, removed = _index_files(tree, con, salvaged, max_entry_bytes)
        with contextlib.closing(disk_sql.open_read_write(new, timeout)) as con:
            disk_sql.checkpoint(con)
        moved_aside = _put_in_place(tree, scratch, stamp)
    finally:
        tree.remove_tree(ENTRIES_DIR, scratch)
    level = DiskLevel(directory, max_bytes, owners=owners, max_entry_bytes=max_entry_bytes, index_timeout=timeout)
    try:
        level.open_writer()  # which moves the salvaged values kept inline into files
        lost = sorted(key for key in (listed or ()) if key not in level)
    finally:
        level.close()
    return {"value_files": files, "recovered": recovered, "removed": removed, "listed": len(listed)
            if listed is not None else None, "lost": lost, "moved_aside": moved_aside}


_SCRATCH = ".rebuild-"  # entries/.rebuild-PID-HEX/: where a new index is built before it is put in place


def _index_files(tree: Tree, index: sqlite3.Connection, salvaged: list[tuple[str, bytes]],
                 max_entry_bytes: int) -> tuple[int, int, int]:
    """Rows in the new `index` for every readable value file (its times from the file and its entry)
    and every salvaged value not in a file (kept inline: the writer moves it to a file when it opens);
    unreadable value files are removed. Returns (value files, rows, removed)."""
    files = removed = 0
    seen: set[str] = set()
    for parts in list(value_files(tree)):
        files += 1
        try:
            found = tree.read(ENTRIES_DIR, *parts, max_bytes=max_entry_bytes)
            data, st = found if found is not None else (b"", None)
            entry = entry_format.decode(data)
            key = check_key(entry.key)
        except (CorruptEntry, OSError, ValueError):
            tree.unlink(ENTRIES_DIR, *parts)
            removed += 1
            continue
        if key in seen or st is None:
            continue  # a second copy (a writer racing the damage): no row points to it, debris removal takes it
        seen.add(key)
        used = st.st_mtime
        disk_sql.insert_value_file(index, key, _number(entry.meta.get("created"), used), used, len(data),
                                   "/".join(parts))
    for key, value in salvaged:
        if key in seen:
            continue
        try:
            entry_format.decode(value, expected_key=key)
        except CorruptEntry:
            removed += 1
            continue
        seen.add(key)
        disk_sql.insert_inline(index, key, time.time(), value)
    return files, len(seen), removed


def _put_in_place(tree: Tree, scratch: str, stamp: str) -> str | None:
    """The new index (entries/SCRATCH/cache.db) replaces the damaged one in one rename; the damaged one
    stays as cache.db.damaged-STAMP (a second name, made first), its journal files moved aside before
    (a journal must never meet another index). Returns the damaged one's new name, or None if there
    was none."""
    aside = f"{INDEX}.damaged-{stamp}"
    kept = False
    with tree.directory(ENTRIES_DIR) as dfd:
        for name in INDEX_FILES[1:]:
            with contextlib.suppress(FileNotFoundError):
                os.rename(name, f"{name}.damaged-{stamp}", src_dir_fd=dfd, dst_dir_fd=dfd)
        with contextlib.suppress(FileNotFoundError):
            os.link(INDEX, aside, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            kept = True
    if not tree.rename((ENTRIES_DIR, scratch, INDEX), (ENTRIES_DIR, INDEX)):
        raise FileNotFoundError(f"the rebuilt index {tree.path}/{ENTRIES_DIR}/{scratch}/{INDEX} vanished")
    return aside if kept else None


def _read_damaged_index(db: Path) -> tuple[set[str] | None, list[tuple[str, bytes]]]:
    """The keys a damaged index still lists and the values kept inside it, as far as SQLite can read
    them (row by row: a truncated file yields its first pages); (None, []) when none can be read."""
    listed: set[str] | None = None
    salvaged: list[tuple[str, bytes]] = []
    try:
        old = disk_sql.open_read_only(db, 5.0)
    except (sqlite3.Error, OSError):
        return None, []
    with contextlib.closing(old):
        try:
            rows = disk_sql.raw_rows(old)
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
