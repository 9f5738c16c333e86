"""Shared tier: a cache directory on a cluster filesystem (NFS, Lustre, GPFS, sshfs, local disk).

Plain content-addressed files, one file per entry in our entry format, no SQLite (its locking is
unreliable on NFS) and no pickle. Layout under the shared directory:

    entries/<key[:2]>/<key>              published entries (mtime = last use, touched <= hourly)
    entries/<key[:2]>/.<key>.<host>.<pid>.<rand>.tmp   a publish in progress, or a crashed one
    locks/<key[:2]>/<key>.lock|.softlock per-key single-flight lock (flock file or soft marker)
    quarantine/<key>.<host>.<pid>.<time>.bad           entries that failed validation

Every entry is validated on read; a bad one is moved to quarantine and reported as CorruptEntry,
so the store rebuilds it and never copies it into a faster tier. The directory must exist (a
missing mount must not silently become a node-local cache); a read-only one serves hits only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from pathlib import Path
from typing import Iterator

from . import entry as entry_format
from . import locks, publish
from .disk import TierUnavailable
from .entry import CorruptEntry, Entry
from .warnings_once import info_once, warn_once

ENTRIES_DIR = "entries"
LOCKS_DIR = "locks"
QUARANTINE_DIR = "quarantine"
LOCK_SUFFIXES = {"flock": ".lock", "soft": ".softlock"}  # distinct: a leftover flock file is no soft marker
TOUCH_INTERVAL = 3600.0  # refresh an entry's recency at most hourly: no write storm on NFS
_KEY_CHARS = set("0123456789abcdefABCDEF")
_READ_ONLY_ERRNOS = (errno.EROFS,)
_DENIED_ERRNOS = (errno.EACCES, errno.EPERM)


def _check_key(key: str) -> str:
    """Keys become file names: only hex content addresses are accepted (no path tricks)."""
    if not key or len(key) > 128 or not set(key) <= _KEY_CHARS:
        raise ValueError(f"not a content key: {key!r}")
    return key


class SharedTier:
    name = "shared"

    def __init__(self, directory: Path, lock_mode: str = "auto", *,
                 stale_after: float = locks.DEFAULT_STALE_AFTER, touch_interval: float = TOUCH_INTERVAL):
        self.directory = Path(directory)
        self.stale_after = stale_after
        self.touch_interval = touch_interval
        if not self.directory.is_dir():
            raise TierUnavailable(f"shared cache directory {self.directory} does not exist (or is not a "
                                  f"directory); create it once, e.g. mkdir -m 2775")
        if not os.access(self.directory, os.R_OK | os.X_OK):
            raise TierUnavailable(f"shared cache directory {self.directory} is not readable")
        _warn_if_world_writable(self.directory)
        self.writable = os.access(self.directory, os.W_OK) and self._make_layout()
        if not self.writable:
            self._note_read_only()
        self.lock_kind = locks.choose_lock_kind(self.directory / LOCKS_DIR, lock_mode) if self.writable else None

    # Lookups ------------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """The valid entry for `key`, or None. A corrupt entry is quarantined and reported."""
        path = self._entry_path(key)
        found = self._read(path)
        if found is None:
            return None
        data, st = found
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._quarantine(path, st)
            raise
        self._touch_if_due(path, st)
        return entry

    def get_raw(self, key: str) -> bytes | None:
        found = self._read(self._entry_path(key))
        return None if found is None else found[0]

    def put(self, entry: Entry) -> None:
        self._publish(entry.key, entry_format.encode(entry))

    def put_raw(self, key: str, data: bytes) -> None:
        """Publish bytes from elsewhere (import); validated first, a bad entry must not reach the cluster."""
        entry_format.decode(data, expected_key=key)
        self._publish(key, data)

    def delete(self, key: str) -> bool:
        try:
            os.unlink(self._entry_path(key))
            return True
        except FileNotFoundError:
            return False

    def __contains__(self, key: str) -> bool:
        """Cheap (one stat): lets a waiting rank notice the moment an entry is published."""
        return os.path.exists(self._entry_path(key))

    def keys(self) -> Iterator[str]:
        return iter([name for name, _ in self._entry_files()])

    def __len__(self) -> int:
        return sum(1 for _ in self._entry_files())

    # Single-flight ------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """Per-key lock across nodes. Yields True when held; False when the entry got published
        while waiting (check `key in tier`) or the wait bound passed (then compile anyway)."""
        if not self.writable:
            raise PermissionError(errno.EROFS, f"shared cache {self.directory} is read-only; no locks")
        path = self._lock_path(key)
        path.parent.mkdir(exist_ok=True)
        with locks.hold(path, self.lock_kind, timeout, self.stale_after, done=lambda: key in self) as held:
            yield held

    # Maintenance (cachectl) ---------------------------------------------------------------
    def records(self) -> list[dict]:
        """Per entry: key, size_bytes, created, last_used (epoch seconds), without reading blobs."""
        out = []
        for key, path in self._entry_files():
            with contextlib.suppress(OSError):
                st = os.stat(path)
                created = _created_from_header(path)
                out.append({"key": key, "size_bytes": st.st_size,
                            "created": created if created is not None else st.st_mtime,
                            "last_used": st.st_mtime})
        return out

    def volume(self) -> int:
        return sum(r["size_bytes"] for r in self.records())

    def prune(self, max_bytes: int | None = None, older_than_seconds: float | None = None) -> list[str]:
        """Delete entries unused for `older_than_seconds`, then least recently used ones until the
        tier holds at most `max_bytes`. Returns the deleted keys."""
        records = sorted(self.records(), key=lambda r: r["last_used"])
        now, removed, total = time.time(), [], sum(r["size_bytes"] for r in records)
        for r in records:
            too_old = older_than_seconds is not None and now - r["last_used"] > older_than_seconds
            too_big = max_bytes is not None and total > max_bytes
            if (too_old or too_big) and self.delete(r["key"]):
                removed.append(r["key"])
                total -= r["size_bytes"]
        return removed

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[str]:
        """Remove temp files of crashed writers, unheld lock files and quarantined entries older than
        the threshold. Returns the removed paths."""
        removed, now = [], time.time()
        for sub in _subdirs(self.directory / ENTRIES_DIR):
            for path in _files(sub):
                if publish.is_temp(path.name) and _age(path, now) > older_than_seconds:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                        removed.append(str(path))
        kinds = {suffix: kind for kind, suffix in LOCK_SUFFIXES.items()}
        for sub in _subdirs(self.directory / LOCKS_DIR):
            for path in _files(sub):
                kind = kinds.get(path.suffix)
                if kind and _age(path, now) > older_than_seconds and locks.remove_if_free(
                        path, kind, min(self.stale_after, older_than_seconds)):
                    removed.append(str(path))
        # Quarantined entries are kept for inspection, then they are debris like the rest.
        return removed + self.remove_quarantined(older_than_seconds)

    def quarantined(self) -> list[dict]:
        """Entries that failed validation: path, key, size_bytes, quarantined_at."""
        out = []
        for path in _files(self.directory / QUARANTINE_DIR):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                out.append({"path": str(path), "key": path.name.split(".", 1)[0],
                            "size_bytes": st.st_size, "quarantined_at": st.st_mtime})
        return out

    def remove_quarantined(self, older_than_seconds: float = 0.0) -> list[str]:
        removed, now = [], time.time()
        for path in _files(self.directory / QUARANTINE_DIR):
            if _age(path, now) >= older_than_seconds:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    removed.append(str(path))
        return removed

    def close(self) -> None:
        pass

    # Internals ----------------------------------------------------------------------------
    def _entry_path(self, key: str) -> Path:
        key = _check_key(key)
        return self.directory / ENTRIES_DIR / key[:2].lower() / key

    def _lock_path(self, key: str) -> Path:
        key = _check_key(key)
        return self.directory / LOCKS_DIR / key[:2].lower() / f"{key}{LOCK_SUFFIXES[self.lock_kind]}"

    def _make_layout(self) -> bool:
        """Create the top-level directories; False if the directory turns out not to be writable."""
        try:
            for sub in (ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR):
                (self.directory / sub).mkdir(exist_ok=True)  # mode 0777 & ~umask; setgid is inherited
            return True
        except OSError as exc:
            if exc.errno in _READ_ONLY_ERRNOS + _DENIED_ERRNOS:
                return False
            raise TierUnavailable(f"cannot use shared cache directory {self.directory}: {exc}") from exc

    def _note_read_only(self) -> None:
        self.writable = False
        info_once(f"shared-read-only:{self.directory}",
                  f"shared cache {self.directory} is read-only: serving its entries, not publishing new ones")

    def _read(self, path: Path) -> tuple[bytes, os.stat_result] | None:
        for attempt in (1, 2):
            try:
                with open(path, "rb") as f:
                    return f.read(), os.fstat(f.fileno())
            except FileNotFoundError:
                return None
            except OSError as exc:  # NFS: a stale handle is usually cured by opening the path again
                if exc.errno != errno.ESTALE or attempt == 2:
                    raise
        return None

    def _publish(self, key: str, data: bytes) -> None:
        if not self.writable:
            return
        final = self._entry_path(key)
        try:
            final.parent.mkdir(exist_ok=True)
            publish.publish(final, data)
        except OSError as exc:
            if exc.errno in _READ_ONLY_ERRNOS:
                self._note_read_only()
                return
            if exc.errno in _DENIED_ERRNOS:
                self.writable = False  # warned once by the store; stop retrying every kernel
            raise

    def _touch_if_due(self, path: Path, st: os.stat_result) -> None:
        """Record use for LRU pruning, at most once per `touch_interval` across all readers (they
        all see the same mtime). os.utime(path) needs only write access, unlike setting explicit
        times, so group members can refresh each other's entries."""
        if not self.writable or time.time() - st.st_mtime < self.touch_interval:
            return
        with contextlib.suppress(OSError):
            os.utime(path)

    def _quarantine(self, path: Path, st: os.stat_result) -> None:
        """Move a bad entry aside (kept for inspection) unless a writer already replaced it."""
        if not self.writable:
            return
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino != st.st_ino:
                return  # republished meanwhile: the new file is not the bad one
            name = f"{path.name}.{publish.host_tag()}.{os.getpid()}.{int(time.time())}.bad"
            target = self.directory / QUARANTINE_DIR / name
            try:
                os.replace(path, target)
            except OSError:
                os.unlink(path)

    def _entry_files(self) -> Iterator[tuple[str, Path]]:
        for sub in _subdirs(self.directory / ENTRIES_DIR):
            for path in _files(sub):
                if not path.name.startswith("."):
                    yield path.name, path


def _warn_if_world_writable(directory: Path) -> None:
    mode = os.stat(directory).st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        warn_once(f"shared-world-writable:{directory}",
                  f"shared cache {directory} is world-writable without the sticky bit: any user can "
                  f"replace cached kernels. Share it with a group instead (chgrp GROUP; chmod 2775; "
                  f"umask 002), or at least chmod +t it")


def _created_from_header(path: Path) -> float | None:
    """The entry's creation time from its metadata, reading only the header and metadata."""
    try:
        created = entry_format.peek_meta_file(path).get("created")
    except (OSError, CorruptEntry):
        return None
    return float(created) if isinstance(created, (int, float)) else None


def _subdirs(directory: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _files(directory: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _age(path: Path, now: float) -> float:
    try:
        return now - os.stat(path).st_mtime
    except OSError:
        return -1.0
