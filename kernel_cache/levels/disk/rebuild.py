"""The local level's index built from its value files: every entry file names its own key, so the
index (`disk_sql`) can always be made again, after damage (`disk_repair`) or from an older
kernel-cache's layout (`disk_old_format`).

The caller holds the index lock (one process builds). The new index is built aside
(entries/.rebuild-PID-HEX/index.db) and put in place in one rename, a damaged one kept aside under a
stamped name: a process opening the index meanwhile sees the old one (or none) or the whole new one,
never a part.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry, check_key
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import ENTRIES_DIR, INDEX, INDEX_FILES, value_files
from kernel_cache.trust.safefs import Tree

SCRATCH = ".rebuild-"  # entries/.rebuild-PID-HEX/: where a new index is built before it is put in place


def build(tree: Tree, directory: Path, max_bytes: int, max_entry_bytes: int, timeout: float,
          whole: bool = True) -> dict[str, Any]:
    """Index every value file in a new index and put it in place. `whole`: each file read and
    checked whole, an unreadable one removed (a repair); else only its head is read for its key, the
    entry checked when it is read (an upgrade, which must not read gigabytes at once). Returns
    `value_files` (found), `keys` (indexed), `removed` and `moved_aside` (the damaged index's new
    name, None where there was none)."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for name, st in tree.listdir(ENTRIES_DIR):  # what a build that died left (the lock is ours)
        if name.startswith(SCRATCH) and stat.S_ISDIR(st.st_mode):
            tree.remove_tree(ENTRIES_DIR, name)
    scratch = f"{SCRATCH}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with tree.directory(ENTRIES_DIR, scratch, create=True):
            pass
        new = directory / ENTRIES_DIR / scratch / INDEX
        with disk_sql.writing(new, timeout, disk_sql.NORMAL, create=True) as con:
            disk_sql.create(con, max_bytes)
            files, keys, removed = _index_files(tree, con, max_entry_bytes, whole)
        with contextlib.closing(disk_sql.open_read_write(new, timeout)) as con:
            disk_sql.checkpoint(con)
        moved_aside = _put_in_place(tree, scratch, stamp)
    finally:
        tree.remove_tree(ENTRIES_DIR, scratch)
    return {"value_files": files, "keys": keys, "removed": removed, "moved_aside": moved_aside}


def _index_files(tree: Tree, index: sqlite3.Connection, max_entry_bytes: int,
                 whole: bool) -> tuple[int, set[str], int]:
    """A row in the new `index` for every readable value file (stored: its entry's creation time;
    last used: the file's time); unreadable ones are removed. Returns (value files, keys, removed)."""
    files = removed = 0
    seen: set[str] = set()
    for parts in list(value_files(tree)):
        files += 1
        try:
            found = tree.read(ENTRIES_DIR, *parts, max_bytes=max_entry_bytes,
                              head=None if whole else entry_format.META_PEEK_BYTES)
            if found is None:
                continue  # gone meanwhile
            data, st = found
            if whole:
                entry = entry_format.decode(data)
                key, meta = check_key(entry.key), entry.meta
            else:
                meta = entry_format.peek_meta_head(data, st.st_size)
                key = check_key(meta.get("key"))
        except (CorruptEntry, OSError, ValueError):
            tree.unlink(ENTRIES_DIR, *parts)
            removed += 1
            continue
        if key in seen:
            continue  # a second copy (a writer racing the damage): no row names it, the debris sweep takes it
        seen.add(key)
        created = meta.get("created")
        stored = float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else st.st_mtime
        disk_sql.insert(index, (key, "/".join(parts), st.st_size, stored, st.st_mtime))
    return files, seen, removed


def _put_in_place(tree: Tree, scratch: str, stamp: str) -> str | None:
    """The new index (entries/SCRATCH/index.db) replaces the old one in one rename; the old one stays
    as index.db.damaged-STAMP (a second name, made first), its journal files moved aside before (a
    journal must never meet another index). Returns the old one's new name, or None if there was none."""
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
