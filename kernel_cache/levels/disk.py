"""The local level: entry files on a node-local disk (`entry_files`), size-bounded with least
recently used eviction, recency from mtimes, as JAX's LRU cache keeps its files.

Trust: the directory and everything it holds must be owned by you, root or the trusted group and
writable by nobody else; otherwise the level is refused (LevelUntrusted) and the store runs from
memory with one warning. A directory that does not exist is made; one holding other
files is refused (`cache_marker`). A read-only mount or directory serves hits. A bad entry is
removed at once (it is only ever this node's copy). Locks are flock files: a local filesystem's
are coherent.

The bound: each process keeps a running total of the entries' bytes, from one walk at its first
write, plus what it writes; past `max_bytes` it walks again (a neighbour's writes and evictions
counted then) and removes the least recently used down to `FILL_AFTER_EVICTION` of the bound, so a
full cache walks once per tenth of its bound written, not per write.

A directory written by the index layout of earlier versions (value files under `entries/aa/bb/`
and `entries/index.db`) is not read: its entries are compiled again as they are used, and its files
are debris (`cachectl prune` removes them).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

from kernel_cache.coordination import locks
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES
from kernel_cache.errors import LevelUnavailable, LevelUntrusted
from kernel_cache.levels import cache_marker
from kernel_cache.levels.cache_marker import ENTRIES_DIR, LOCKS_DIR, STATS_DIR
from kernel_cache.levels.entry_files import EntryFiles
from kernel_cache.settings.config import Config
from kernel_cache.telemetry.counters import COUNTERS_DB
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile
from kernel_cache.trust.signing import Signer

FILL_AFTER_EVICTION = 0.9  # an eviction leaves this share of the bound filled
COUNTERS_FILES = (COUNTERS_DB, COUNTERS_DB + "-wal", COUNTERS_DB + "-shm")
OLD_LAYOUT = frozenset({"index.db", "index.db-wal", "index.db-shm", "cache.db", "cache.db-wal", "cache.db-shm"})


class DiskLevel(EntryFiles):
    name = "disk"
    label = "local cache"
    layout = (ENTRIES_DIR, LOCKS_DIR, STATS_DIR)  # no quarantine: a bad local entry is removed
    kind, own_names = cache_marker.LOCAL, cache_marker.LOCAL_NAMES

    def __init__(self, directory: Path, max_bytes: int = 8 << 30, *, owners: Owners | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, read_only: bool = False):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._volume: int | None = None  # this process's running total of the entries' bytes
        self._volume_lock = threading.Lock()
        try:
            self.tree = Tree(self.directory, owners or Owners.current(), create=not read_only)
            try:
                for name in COUNTERS_FILES:  # read through SQLite, which opens them by path
                    self.tree.check_regular(STATS_DIR, name)
                self._start(authenticate=None, max_entry_bytes=max_entry_bytes, stale_after=locks.DEFAULT_STALE_AFTER,
                            read_only=read_only, lock_mode="flock")
            except BaseException:
                self.tree.close()
                raise
        except UnsafeFile as exc:
            raise LevelUntrusted(
                f"local cache {exc.path} {exc.reason}: another user could plant kernels there. Not using "
                f"it; create KERNEL_CACHE_DIR yourself (mkdir -m 700), or name the group that shares it "
                f"with KERNEL_CACHE_TRUSTED_GROUP") from None
        except OSError as exc:  # (a read-only directory is no error: `_start` opens it read-only)
            raise LevelUnavailable(f"cannot use cache directory {directory}: {exc}") from exc

    def _foreign(self, name: str, st: os.stat_result) -> bool:
        """The index layout's value-file folders (`entries/aa/bb/`)."""
        return stat.S_ISDIR(st.st_mode) and len(name) == 2

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[tuple[str, int]]:
        """The shared sweep, plus the index layout's files and the flat lock files it kept."""
        removed = super().remove_debris(older_than_seconds)
        for sub in (ENTRIES_DIR, STATS_DIR):
            for name, st in self.tree.listdir(sub):
                if name in OLD_LAYOUT and self.tree.unlink(sub, name, expect_ino=st.st_ino):
                    removed.append((os.path.join(self.directory, sub, name), st.st_size))
        for name, st in self.tree.listdir(LOCKS_DIR):
            if name.endswith(".lock") and stat.S_ISREG(st.st_mode) and locks.remove_if_free(
                    self.tree, (LOCKS_DIR, name), "flock", older_than_seconds):
                removed.append((os.path.join(self.directory, LOCKS_DIR, name), 0))
        return removed

    # The bound ----------------------------------------------------------------------------
    def _published(self, size: int) -> None:
        with self._volume_lock:
            if self._volume is None:
                self._volume = self.volume()
            else:
                self._volume += size
            due = self._volume > self.max_bytes
        if due:
            self.cull(FILL_AFTER_EVICTION)

    def cull(self, fill: float = 1.0) -> int:
        """Remove the least recently used entries until the rest fit in `fill` of `max_bytes`; how
        many went."""
        files = sorted(self._entry_files(), key=lambda found: found[1].st_mtime)
        volume = sum(st.st_size for _, st in files)
        evicted = 0
        for key, st in files:
            if volume <= self.max_bytes * fill:
                break
            with contextlib.suppress(OSError):
                if self.tree.unlink(ENTRIES_DIR, key[:2], key, expect_ino=st.st_ino):
                    evicted += 1
            volume -= st.st_size
        with self._volume_lock:
            self._volume = volume
        return evicted


def open_from_config(config: Config, owners: Owners, signer: Signer | None, read_only: bool) -> DiskLevel:
    """The local level KERNEL_CACHE_DIR names (`BACKENDS` asks only where it names one)."""
    assert config.dir is not None
    level = DiskLevel(config.dir, config.max_bytes, owners=owners, max_entry_bytes=config.max_entry_bytes,
                      read_only=read_only)
    if not level.writable and not read_only:
        warn_once(f"disk-read-only:{config.dir}",
                  f"local cache {config.dir} cannot be written (no write access): serving its "
                  f"entries, new kernels stay in memory")
    return level

