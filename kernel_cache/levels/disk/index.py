"""The local level's on-disk layout and its SQLite index, opened safely: no pickle, bounded waits.

diskcache keeps an SQLite index (entries/cache.db) and one value file per entry
(entries/aa/bb/<hex>.val). Everything here reads that layout through `safefs` and never lets
diskcache deserialize anything: `RawOnlyDisk` refuses pickled and text rows. What diskcache's public
API cannot do on that index is in `disk_sql`, the one module that reads its tables itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache

from kernel_cache.entries.entry import CorruptEntry
from kernel_cache.errors import LevelUnavailable, LevelUntrusted
from kernel_cache.levels.disk.sql import wait_for_writers
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile
from kernel_cache.value_class import FrozenValue

ENTRIES_DIR = "entries"
LOCKS_DIR = "locks"
STATS_DIR = "stats"
INDEX = "cache.db"

INDEX_FILES = (INDEX, INDEX + "-wal", INDEX + "-shm")
COUNTERS_DB = "counters.db"  # in STATS_DIR: the counters' own table (kernel_cache.telemetry.counters)
STATS_FILES = (*INDEX_FILES, COUNTERS_DB, COUNTERS_DB + "-wal", COUNTERS_DB + "-shm")
INDEX_LOCK = "index.lock"  # in LOCKS_DIR: held while the index is rebuilt, so one process rebuilds it
VALUE_FILE = re.compile(r"([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{28}\.val)")
_NOT_RAW_KEY = "<a key kernel-cache did not write>"


class ValueFile(FrozenValue):
    """What `RawOnlyDisk.fetch` answers for a value kept in a file: the file's name under entries/,
    never its bytes (DiskLevel reads those through safefs)."""

    _fields = ("filename",)
    filename: str

    def __init__(self, filename: str) -> None:
        self.__dict__.update(filename=filename)


class RawOnlyDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no types
    """diskcache's (de)serializer without pickle: keys and values are stored raw; a row stored any
    other way (pickle, text) was not written by kernel-cache and is never deserialized. Entry bytes
    kept in value files are read by DiskLevel through safefs, never through diskcache: `Cache.get`
    answers a `ValueFile` for them (so that the LRU touch, a `get`, reads nothing), and only inline
    raw values (the stats counters) are fetched."""

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
            return ValueFile(str(filename))
        raise CorruptEntry("not an inline raw value or a value file: pickle and text rows are never loaded")


def value_files(tree: Tree) -> Iterator[tuple[str, str, str]]:
    """(aa, bb, name.val) of every value file diskcache wrote under entries/ (nothing else)."""
    for a in tree.subdirs(ENTRIES_DIR):
        for b in tree.subdirs(ENTRIES_DIR, a):
            for name, st in tree.listdir(ENTRIES_DIR, a, b):
                if stat.S_ISREG(st.st_mode) and VALUE_FILE.fullmatch(f"{a}/{b}/{name}"):
                    yield a, b, name


def open_index(directory: Path, timeout: float, **settings: Any) -> diskcache.Cache:
    """A diskcache index whose opening waits at most about `timeout` for a neighbour's write
    transaction: diskcache's own set-up retries each statement for 60 s, so probe first."""
    db = Path(directory) / INDEX
    if db.exists():
        wait_for_writers(db, timeout)
    settings.setdefault("disk", RawOnlyDisk)
    return diskcache.Cache(str(directory), timeout=timeout, **settings)


def has_value_files(tree: Tree) -> bool:
    """Whether any value file is there (stops at the first)."""
    return next(value_files(tree), None) is not None


def describe_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, OSError) else text


def check_tree(tree: Tree) -> None:
    """Every level a reader relies on: the index files and the directories (UnsafeFile if not)."""
    for sub in (ENTRIES_DIR, LOCKS_DIR, STATS_DIR):
        with contextlib.suppress(FileNotFoundError), tree.directory(sub):
            pass
    for sub, names in ((ENTRIES_DIR, INDEX_FILES), (STATS_DIR, STATS_FILES)):
        for name in names:
            st = tree.lstat(sub, name)  # None as well when `sub` itself is missing
            if st is None:
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeFile(os.path.join(tree.path, sub, name), "is not a regular file")
            problem = tree.owners.problem(st) if tree.owners is not None else None
            if problem:
                raise UnsafeFile(os.path.join(tree.path, sub, name), problem, owner=True)


def open_tree(directory: Path, owners: Owners | None, create: bool) -> Tree:
    """The cache directory as a checked Tree; LevelUntrusted/LevelUnavailable explain a refusal."""
    try:
        tree = Tree(directory, owners or Owners.current(), create=create)
        check_tree(tree)
        return tree
    except UnsafeFile as exc:
        raise LevelUntrusted(
            f"local cache {exc.path} {exc.reason}: another user could plant kernels there. Not using "
            f"it; create KERNEL_CACHE_DIR yourself (mkdir -m 700), or name the group that shares it "
            f"with KERNEL_CACHE_TRUSTED_GROUP") from None
    except OSError as exc:
        raise LevelUnavailable(f"cannot use cache directory {directory}: {exc}") from exc
