"""Shared level: a cache directory on a cluster filesystem (NFS, Lustre, GPFS, sshfs, local disk).

Plain content-addressed files, one file per entry in our entry format, no SQLite (its locking is
unreliable on NFS) and no pickle. Layout under the shared directory:

    entries/<key[:2]>/<key>              published entries (mtime = last use, touched <= hourly)
    entries/<key[:2]>/.<key>.<host>.<pid>.<rand>.tmp   a publish in progress, or a crashed one
    locks/<key[:2]>/<key>.lock|.softlock per-key single-flight lock (flock file or soft marker)
    quarantine/<key>.<host>.<pid>.<time>.bad           entries that failed validation

Other users write here, so every access goes through `safefs.Tree` (no symlink followed, no FIFO
opened, reads capped at KERNEL_CACHE_MAX_ENTRY_BYTES, names other than content keys ignored).
Who is believed (see README, "Trust model"):
- without a signing key, the directory and every level below it must be owned by you, root or the
  trusted group and writable by nobody else, or the level is skipped with one warning;
- with a signing key, ownership is not required: every entry read must carry a valid signature
  for that key (`authenticate`), or it is rejected (a miss, left in place, counted).
Every entry is validated on read; a damaged one is moved to quarantine and reported as
CorruptEntry, so the store rebuilds it and never copies it into a faster level. The directory must
exist (a missing mount must not silently become a node-local cache); a read-only one serves hits.

This module is long because it is one level's whole Level protocol, maintenance included.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from kernel_cache.coordination import locks, publish
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, Entry, check_key, is_key
from kernel_cache.errors import LevelUnavailable, LevelUntrusted, RejectedEntry
from kernel_cache.levels import cache_marker
from kernel_cache.levels.protocols import InDirectory
from kernel_cache.sanitize import escaped
from kernel_cache.settings.config import Config
from kernel_cache.telemetry.warnings_once import info_once, warn_once
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile
from kernel_cache.trust.signing import Signer

ENTRIES_DIR = "entries"
LOCKS_DIR = "locks"
QUARANTINE_DIR = "quarantine"
SHARED_NAMES = frozenset({ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR, cache_marker.MARKER})  # all it ever holds
LOCK_SUFFIXES = {"flock": ".lock", "soft": ".softlock"}  # distinct: a leftover flock file is no soft marker
TOUCH_INTERVAL = 3600.0  # refresh an entry's recency at most hourly: no write storm on NFS
_READ_ONLY_ERRNOS = (errno.EROFS,)
_DENIED_ERRNOS = (errno.EACCES, errno.EPERM)
_FANOUT_CHARS = set("0123456789abcdef")
# raw entry bytes -> why they are not acceptable (unsigned, another key...), or None
Authenticate = Callable[[bytes], "str | None"]


class SharedLevel(InDirectory):
    name = "shared"

    def __init__(self, directory: Path, lock_mode: str = "auto", *,
                 stale_after: float = locks.DEFAULT_STALE_AFTER, touch_interval: float = TOUCH_INTERVAL,
                 owners: Owners | None = None, authenticate: Authenticate | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, read_only: bool = False):
        """`owners`: whose files to believe (default: you and root). With `authenticate` (a signing
        key), ownership is not checked: content is. `read_only`: an operator looking, who changes
        nothing there (no layout, marker, lock probe, touch or quarantine)."""
        self.directory = Path(directory)
        self.stale_after = stale_after
        self.touch_interval = touch_interval
        self._touch_lock = threading.Lock()
        self._pending_touches: set[str] = set()  # `touch`ed keys, refreshed by flush_touches
        self.authenticate = authenticate
        self.max_entry_bytes = max_entry_bytes
        if not self.directory.is_dir():
            raise LevelUnavailable(f"shared cache directory {self.directory} does not exist (or is not a "
                                  f"directory); create it once, e.g. mkdir -m 2775")
        if not os.access(self.directory, os.R_OK | os.X_OK):
            raise LevelUnavailable(f"shared cache directory {self.directory} is not readable")
        trust = None if authenticate is not None else (owners or Owners.current())
        try:
            self.tree = Tree(self.directory, trust)
            for sub in (ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR):
                with contextlib.suppress(FileNotFoundError), self.tree.directory(sub):
                    pass
            may_write = not read_only and os.access(self.directory, os.W_OK)
            cache_marker.check(self.tree, cache_marker.SHARED, SHARED_NAMES, write=may_write)
        except UnsafeFile as exc:
            raise LevelUntrusted(
                f"shared cache {exc.path} {exc.reason}: anyone who can write there could plant kernels "
                f"you would run; fix the ownership (README: 'Trust model'), "
                f"name the group with KERNEL_CACHE_TRUSTED_GROUP, or sign entries with "
                f"KERNEL_CACHE_SIGNING_KEY_FILE") from None
        if trust is None:
            _warn_if_world_writable(self.directory)
        self.writable = may_write and self._make_layout()
        if not self.writable and not read_only:
            self._note_read_only()
        self.lock_kind = locks.choose_lock_kind(self.tree, (LOCKS_DIR,), lock_mode) if self.writable else None

    # Lookups ------------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """The valid entry for `key`, or None. A damaged entry is quarantined and raised as
        CorruptEntry; one that fails authentication is raised as RejectedEntry and left alone."""
        parts = self._entry_parts(key)
        found = self._read(parts)
        if found is None:
            return None
        data, st = found
        if self.authenticate is not None:
            problem = self.authenticate(data)
            if problem is not None:
                raise RejectedEntry(f"shared entry {key[:12]} is {problem}")
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._quarantine(parts, st.st_ino)
            raise
        self._touch_if_due(parts, st)
        return entry

    def get_raw(self, key: str) -> bytes | None:
        found = self._read(self._entry_parts(key))
        return None if found is None else found[0]

    peek_raw = get_raw  # reading never changes recency here (only get() touches)

    def put(self, entry: Entry) -> None:
        self._publish(entry.key, entry_format.encode(entry))

    def keep(self, entry: Entry, data: bytes) -> None:
        self.put_raw(entry.key, data)

    def put_raw(self, key: str, data: bytes) -> None:
        """Publish bytes from elsewhere (import, a signed copy); validated first, a bad entry must
        not reach the cluster."""
        entry_format.decode(data, expected_key=check_key(key))
        self._publish(key, data)

    def delete(self, key: str) -> bool:
        return self.tree.unlink(*self._entry_parts(key))

    def __contains__(self, key: object) -> bool:
        """Cheap (one lstat): lets a waiting rank notice the moment an entry is published."""
        try:
            st = self.tree.lstat(*self._entry_parts(key))
        except (OSError, ValueError):
            return False
        return st is not None and stat.S_ISREG(st.st_mode)

    def keys(self) -> Iterator[str]:
        return iter([name for name, _ in self._entry_files()])

    def __len__(self) -> int:
        return sum(1 for _ in self._entry_files())

    # Single-flight ------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """Per-key lock across nodes. Yields True when held; False when the entry got published
        while waiting (check `key in level`) or the wait bound passed (then compile anyway)."""
        if not self.writable:
            raise PermissionError(errno.EROFS, f"shared cache {self.directory} is read-only; no locks")
        check_key(key)
        kind = self.lock_kind or "soft"
        parts = (LOCKS_DIR, key[:2], f"{key}{LOCK_SUFFIXES[kind]}")
        with locks.hold(self.tree, parts, kind, timeout, self.stale_after,
                        done=lambda: key in self) as held:
            yield held

    # Maintenance (cachectl) ---------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created, last_used (epoch seconds), without reading blobs."""
        out = []
        for key, st in self._entry_files():
            created = self._created_from_header(key, st)
            out.append({"key": key, "size_bytes": st.st_size,
                        "created": created if created is not None else st.st_mtime,
                        "last_used": st.st_mtime})
        return out

    def volume(self) -> int:
        return sum(r["size_bytes"] for r in self.listing())

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[tuple[str, int]]:
        """Remove planted non-files at entry paths (links, FIFOs, directories: at once, no writer
        of ours makes one), and temp files of crashed writers, unheld lock files and quarantined
        entries older than the threshold. Returns [(path, bytes)]."""
        removed, now = [], time.time()
        for sub in self._fanout(ENTRIES_DIR):
            for name, st in self.tree.listdir(ENTRIES_DIR, sub):
                where = os.path.join(self.directory, ENTRIES_DIR, sub, name)
                if is_key(name) and not stat.S_ISREG(st.st_mode):  # planted: no writer of ours makes one
                    if self._remove_any((ENTRIES_DIR, sub, name), st):
                        removed.append((where, st.st_size))
                elif publish.is_temp(name) and now - st.st_mtime > older_than_seconds and \
                        self._remove_any((ENTRIES_DIR, sub, name), st):
                    removed.append((where, st.st_size))
        kinds = {suffix: kind for kind, suffix in LOCK_SUFFIXES.items()}
        for sub in self._fanout(LOCKS_DIR):
            for name, st in self.tree.listdir(LOCKS_DIR, sub):
                kind = kinds.get(os.path.splitext(name)[1])
                if kind and now - st.st_mtime > older_than_seconds and locks.remove_if_free(
                        self.tree, (LOCKS_DIR, sub, name), kind, min(self.stale_after, older_than_seconds)):
                    removed.append((os.path.join(self.directory, LOCKS_DIR, sub, name), 0))
        # Quarantined entries are kept for inspection, then they are debris like the rest.
        return removed + self.remove_quarantined(older_than_seconds)

    def quarantined(self) -> list[dict[str, Any]]:
        """Entries that failed validation: path, key, size_bytes, quarantined_at."""
        return [{"path": os.path.join(self.directory, QUARANTINE_DIR, name), "key": name.split(".", 1)[0],
                 "size_bytes": st.st_size, "quarantined_at": st.st_mtime,
                 "kind": "directory" if stat.S_ISDIR(st.st_mode) else "file"}
                for name, st in self.tree.listdir(QUARANTINE_DIR)]

    def remove_quarantined(self, older_than_seconds: float = 0.0) -> list[tuple[str, int]]:
        removed, now = [], time.time()
        for name, st in self.tree.listdir(QUARANTINE_DIR):
            if now - st.st_mtime >= older_than_seconds and self._remove_any((QUARANTINE_DIR, name), st):
                removed.append((os.path.join(self.directory, QUARANTINE_DIR, name), st.st_size))
        return removed

    def touch(self, keys: Iterable[str]) -> None:
        valid = [check_key(key) for key in keys]
        with self._touch_lock:
            self._pending_touches.update(valid)

    def flush_touches(self) -> None:
        """Refresh the mtimes of entries `touch` named, each at most once per `touch_interval` (a
        stat per entry, paid at close or exit rather than per call)."""
        with self._touch_lock:
            keys, self._pending_touches = self._pending_touches, set()
        for key in sorted(keys):
            parts = self._entry_parts(key)
            with contextlib.suppress(OSError):
                st = self.tree.lstat(*parts)
                if st is not None and stat.S_ISREG(st.st_mode):
                    self._touch_if_due(parts, st)

    def close(self) -> None:
        self.flush_touches()
        self.tree.close()

    # Internals ----------------------------------------------------------------------------
    @staticmethod
    def _entry_parts(key: object) -> tuple[str, str, str]:
        valid = check_key(key)
        return ENTRIES_DIR, valid[:2], valid

    def _make_layout(self) -> bool:
        """Create the top-level directories; False if the directory turns out not to be writable."""
        try:
            for sub in (ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR):
                with self.tree.directory(sub, create=True):  # 0777 & ~umask; setgid is inherited
                    pass
            return True
        except UnsafeFile:
            raise
        except OSError as exc:
            if exc.errno in _READ_ONLY_ERRNOS + _DENIED_ERRNOS:
                return False
            raise LevelUnavailable(f"cannot use shared cache directory {self.directory}: {exc}") from exc

    def _note_read_only(self) -> None:
        self.writable = False
        info_once(f"shared-read-only:{self.directory}",
                  f"shared cache {self.directory} is read-only: serving its entries, not publishing new ones")

    def _read(self, parts: tuple[str, ...]) -> tuple[bytes, os.stat_result] | None:
        for attempt in (1, 2):
            try:
                return self.tree.read(*parts, max_bytes=self.max_entry_bytes)
            except UnsafeFile as exc:
                if exc.owner:
                    raise RejectedEntry(f"shared entry {parts[-1][:12]} {exc.reason}") from None
                self._quarantine(parts, None)  # a planted link, FIFO or giant: move the name aside
                raise CorruptEntry(f"refused: it {exc.reason}") from None
            except OSError as exc:  # NFS: a stale handle is usually cured by opening the path again
                if exc.errno != errno.ESTALE or attempt == 2:
                    raise
                self.tree.reopen()
        return None

    def _publish(self, key: str, data: bytes) -> None:
        if not self.writable:
            return
        parts = self._entry_parts(key)
        try:
            try:
                publish.publish(self.tree, parts, data)
            except IsADirectoryError:  # a directory planted at the entry's name: move it aside, once
                self._quarantine(parts, None)
                publish.publish(self.tree, parts, data)
        except UnsafeFile:
            raise
        except OSError as exc:
            if exc.errno in _READ_ONLY_ERRNOS:
                self._note_read_only()
                return
            if exc.errno in _DENIED_ERRNOS:
                self.writable = False  # warned once by the store; stop retrying every kernel
            raise

    def _touch_if_due(self, parts: tuple[str, ...], st: os.stat_result) -> None:
        """Record use for LRU pruning, at most once per `touch_interval` across all readers (they
        all see the same mtime). Setting the time to now needs only write access, unlike setting
        explicit times, so group members can refresh each other's entries."""
        if not self.writable or time.time() - st.st_mtime < self.touch_interval:
            return
        with contextlib.suppress(OSError):
            self.tree.touch(*parts)

    def _quarantine(self, parts: tuple[str, ...], ino: int | None) -> None:
        """Move a bad entry aside (kept for inspection) unless a writer already replaced it."""
        if not self.writable:
            return
        name = f"{parts[-1]}.{publish.host_tag()}.{os.getpid()}.{int(time.time())}.bad"
        try:
            if self.tree.rename(parts, (QUARANTINE_DIR, name), expect_ino=ino, directories=True):
                return
        except OSError:
            pass
        with contextlib.suppress(OSError):  # not movable (another user's directory): remove what we can
            st = self.tree.lstat(*parts)
            if st is not None and (ino is None or st.st_ino == ino) and not self._remove_any(parts, st):
                warn_once(f"shared-stuck:{parts[-1]}",
                          f"cannot move or remove {escaped(os.path.join(self.directory, *parts))}, planted at an "
                          f"entry's path: this kernel is not shared until its owner or an admin removes it")

    def _remove_any(self, parts: tuple[str, ...], st: os.stat_result) -> bool:
        """Remove a file, link, FIFO or whole directory tree found at root/parts."""
        if stat.S_ISDIR(st.st_mode):
            return self.tree.remove_tree(*parts)
        return self.tree.unlink(*parts, expect_ino=st.st_ino)

    def _fanout(self, top: str) -> list[str]:
        return [n for n in self.tree.subdirs(top) if len(n) == 2 and set(n) <= _FANOUT_CHARS]

    def _entry_files(self) -> Iterator[tuple[str, os.stat_result]]:
        """(key, lstat) of every published entry; foreign names, temp files and non-files skipped."""
        for sub in self._fanout(ENTRIES_DIR):
            for name, st in self.tree.listdir(ENTRIES_DIR, sub):
                if is_key(name) and name.startswith(sub) and stat.S_ISREG(st.st_mode):
                    yield name, st

    def _created_from_header(self, key: str, st: os.stat_result) -> float | None:
        """The entry's creation time from its metadata, reading only the header and metadata."""
        try:
            found = self.tree.read(ENTRIES_DIR, key[:2], key, max_bytes=self.max_entry_bytes,
                                   head=entry_format.META_PEEK_BYTES)
            if found is None:
                return None
            created = entry_format.peek_meta_head(found[0], found[1].st_size).get("created")
        except (OSError, CorruptEntry):
            return None
        return float(created) if isinstance(created, (int, float)) else None


def _warn_if_world_writable(directory: Path) -> None:
    mode = os.stat(directory).st_mode
    if mode & stat.S_IWOTH:
        warn_once(f"shared-world-writable:{directory}",
                  f"shared cache {directory} is writable by every user: entries are checked by "
                  f"signature, but anyone can delete them. Share it with a group instead "
                  f"(chgrp GROUP; chmod 2770)")


def open_from_config(config: Config, owners: Owners, signer: Signer | None, read_only: bool) -> SharedLevel | None:
    """The shared level KERNEL_CACHE_SHARED_DIR names (None: not configured)."""
    if config.shared_dir is None:
        return None
    level = SharedLevel(config.shared_dir, lock_mode=config.lock, stale_after=config.soft_lock_stale,
                      owners=owners, authenticate=signer.problem if signer is not None else None,
                      max_entry_bytes=config.max_entry_bytes, read_only=read_only)
    if signer is not None:
        info_once(f"shared-signed:{config.shared_dir}",
                  f"shared cache {config.shared_dir}: accepting only entries signed with key {signer.key_id.hex()}")
    return level


def location_in(config: Config) -> str:
    """Where the shared level of `config` lives (for a message about a level that did not open)."""
    return str(config.shared_dir)
