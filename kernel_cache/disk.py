"""Node-local persistent tier on diskcache (SQLite index + files), size-bounded with LRU eviction.

Values are our own encoded entries (bytes), which diskcache stores raw: nothing is pickled.
diskcache's SQLite locking is unreliable on network filesystems, so this tier is for local disks
only; the shared tier (plain files) serves multi-node clusters.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

import diskcache
import filelock

from . import entry as entry_format
from .entry import CorruptEntry, Entry

ENTRIES_DIR = "entries"
LOCKS_DIR = "locks"


class TierUnavailable(OSError):
    """The tier cannot be used at all (directory missing and not creatable, not writable)."""


class DiskTier:
    name = "disk"

    def __init__(self, directory: Path, max_bytes: int = 8 << 30):
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / LOCKS_DIR).mkdir(exist_ok=True)
            self._cache = diskcache.Cache(
                str(self.directory / ENTRIES_DIR), size_limit=max_bytes,
                eviction_policy="least-recently-used", cull_limit=10, statistics=False)
        except Exception as exc:  # OSError, sqlite3.OperationalError (read-only, full disk)
            raise TierUnavailable(f"cannot use cache directory {self.directory}: {exc}") from exc

    # Lookups ------------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """The valid entry for `key`, or None. A corrupt entry is deleted and reported."""
        data = self._cache.get(key, default=None, read=False, retry=True)
        if data is None:
            return None
        try:
            return entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self.delete(key)
            raise

    def get_raw(self, key: str) -> bytes | None:
        return self._cache.get(key, default=None, retry=True)

    def put(self, entry: Entry) -> None:
        self.put_raw(entry.key, entry_format.encode(entry))

    def put_raw(self, key: str, data: bytes) -> None:
        self._cache.set(key, data, retry=True)

    def delete(self, key: str) -> bool:
        return bool(self._cache.delete(key, retry=True))

    def keys(self) -> Iterator[str]:
        return iter(list(self._cache.iterkeys()))

    def __contains__(self, key: str) -> bool:
        return key in self._cache

    def __len__(self) -> int:
        return len(self._cache)

    # Maintenance --------------------------------------------------------------------------
    def records(self) -> list[dict]:
        """Per entry: key, size_bytes, created, last_used (epoch seconds), without reading blobs."""
        rows = self._cache._sql(  # diskcache keeps these columns; no public accessor lists them
            "SELECT key, size, store_time, access_time FROM Cache").fetchall()
        return [{"key": k, "size_bytes": int(s), "created": float(st), "last_used": float(at)}
                for k, s, st, at in rows]

    def volume(self) -> int:
        return int(self._cache.volume())

    def set_max_bytes(self, max_bytes: int) -> None:
        self._cache.reset("size_limit", max_bytes)

    def cull(self) -> int:
        return int(self._cache.cull(retry=True))

    def clear(self) -> int:
        return int(self._cache.clear(retry=True))

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """A per-key lock shared by every process on this node; yields False if it timed out."""
        path = self.directory / LOCKS_DIR / f"{key}.lock"
        lock = filelock.FileLock(str(path), timeout=timeout)
        try:
            lock.acquire()
        except filelock.Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()
            with contextlib.suppress(OSError):
                if time.time() - os.stat(path).st_mtime > 3600:
                    os.unlink(path)

    def close(self) -> None:
        self._cache.close()

    # Maintenance helpers for cachectl (read without touching LRU order; debris) ----------
    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes for `key` without bumping its last-used time (listing must not
        reorder the LRU). Only raw byte values are read: a pickled value is never loaded."""
        row = self._cache._sql(  # diskcache's get() always updates access_time under LRU
            "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
        if row is None:
            return None
        mode, filename, value = row
        if mode == diskcache.core.MODE_RAW:
            return bytes(value)
        if mode == diskcache.core.MODE_BINARY:
            try:
                with open(os.path.join(self._cache.directory, filename), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        return None  # text or pickle: nothing we wrote; verify reports it as corrupt

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[tuple[str, int]]:
        """Delete what crashed processes leave behind: value files no index row points to and
        lock files, both only once older than `older_than_seconds` (a live writer's files are
        seconds old). Returns [(path, bytes)] removed."""
        cutoff = time.time() - older_than_seconds
        entries_dir = Path(self._cache.directory)
        referenced = {os.path.normpath(f) for (f,) in self._cache._sql(
            "SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()}
        candidates = [p for p in entries_dir.glob("*/*/*.val")
                      if os.path.normpath(str(p.relative_to(entries_dir))) not in referenced]
        candidates += list((self.directory / LOCKS_DIR).glob("*.lock"))
        removed = []
        for path in candidates:
            try:
                st = path.stat()
                if st.st_mtime < cutoff:
                    path.unlink()
                    removed.append((str(path), st.st_size))
            except OSError:
                continue
        return removed
