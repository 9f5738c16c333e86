"""The local level's on-disk layout, its names and its checked opening.

One value file per entry (entries/aa/bb/<28 hex>.val, each an encoded entry that names its own key)
and our own SQLite index of them (entries/index.db: `disk_sql`), a cache of the files that
`disk_rebuild` can always rebuild. A directory an older kernel-cache wrote holds diskcache's index
(entries/cache.db) instead; `disk_old_format` upgrades it. Everything here reads the layout through
`safefs`: no link is followed, the index files must be regular files of a trusted owner.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from kernel_cache.errors import LevelUnavailable, LevelUntrusted
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile

ENTRIES_DIR = "entries"
LOCKS_DIR = "locks"
STATS_DIR = "stats"
INDEX = "index.db"  # in ENTRIES_DIR: our index of the value files (`disk_sql`)
OLD_INDEX = "cache.db"  # diskcache's index, as an older kernel-cache kept it (in ENTRIES_DIR, and its counters in STATS_DIR)

INDEX_FILES = (INDEX, INDEX + "-wal", INDEX + "-shm")
OLD_INDEX_FILES = (OLD_INDEX, OLD_INDEX + "-wal", OLD_INDEX + "-shm")
COUNTERS_DB = "counters.db"  # in STATS_DIR: the counters' own table (kernel_cache.telemetry.counters)
ENTRIES_FILES = (*INDEX_FILES, *OLD_INDEX_FILES)
STATS_FILES = (*OLD_INDEX_FILES, COUNTERS_DB, COUNTERS_DB + "-wal", COUNTERS_DB + "-shm")
INDEX_LOCK = "index.lock"  # in LOCKS_DIR: held while the index is built, so one process builds it
VALUE_FILE = re.compile(r"([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{28}\.val)")
TEMP_SUFFIX = ".tmp"  # a value file being written: `.<name>.<pid>.<hex>.tmp` beside it


def value_files(tree: Tree, temp: bool = False) -> Iterator[tuple[str, str, str]]:
    """(aa, bb, name.val) of every value file under entries/ (nothing else); `temp`: the value
    files being written (or left by a writer that died) instead."""
    for a in tree.subdirs(ENTRIES_DIR):
        for b in tree.subdirs(ENTRIES_DIR, a):
            for name, st in tree.listdir(ENTRIES_DIR, a, b):
                if not stat.S_ISREG(st.st_mode):
                    continue
                if temp and name.startswith(".") and name.endswith(TEMP_SUFFIX) and len(a) == len(b) == 2:
                    yield a, b, name
                elif not temp and VALUE_FILE.fullmatch(f"{a}/{b}/{name}"):
                    yield a, b, name


def has_value_files(tree: Tree) -> bool:
    """Whether any value file is there (stops at the first)."""
    return next(value_files(tree), None) is not None


def describe_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, OSError) else text


def check_file(tree: Tree, sub: str, name: str) -> os.stat_result | None:
    """The lstat of an index file, or None where it is missing; UnsafeFile where it is not a regular
    file (a link, a FIFO) or may have been written by an untrusted user. Asked before SQLite opens
    it: SQLite follows links and a FIFO would block its reader."""
    st = tree.lstat(sub, name)  # None as well when `sub` itself is missing
    if st is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(os.path.join(tree.path, sub, name), "is not a regular file")
    problem = tree.owners.problem(st) if tree.owners is not None else None
    if problem:
        raise UnsafeFile(os.path.join(tree.path, sub, name), problem, owner=True)
    return st


def check_tree(tree: Tree) -> None:
    """Every level a reader relies on: the index files and the directories (UnsafeFile if not)."""
    for sub in (ENTRIES_DIR, LOCKS_DIR, STATS_DIR):
        with contextlib.suppress(FileNotFoundError), tree.directory(sub):
            pass
    for sub, names in ((ENTRIES_DIR, ENTRIES_FILES), (STATS_DIR, STATS_FILES)):
        for name in names:
            check_file(tree, sub, name)


def open_tree(directory: Path, owners: Owners | None, create: bool) -> Tree:
    """The cache directory as a checked Tree; LevelUntrusted/LevelUnavailable explain a refusal."""
    try:
        tree = Tree(directory, owners or Owners.current(), create=create)
        try:
            check_tree(tree)
        except BaseException:
            tree.close()
            raise
        return tree
    except UnsafeFile as exc:
        raise LevelUntrusted(
            f"local cache {exc.path} {exc.reason}: another user could plant kernels there. Not using "
            f"it; create KERNEL_CACHE_DIR yourself (mkdir -m 700), or name the group that shares it "
            f"with KERNEL_CACHE_TRUSTED_GROUP") from None
    except OSError as exc:
        raise LevelUnavailable(f"cannot use cache directory {directory}: {exc}") from exc
