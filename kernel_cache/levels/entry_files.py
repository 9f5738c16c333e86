"""Entry files: the one layout of the local and the shared level, one key-named file per entry.

    entries/<key[:2]>/<key>                              an entry (mtime = last use)
    entries/<key[:2]>/.<key>.<host>.<pid>.<rand>.tmp     a publish in progress, or a crashed one
    locks/<key[:2]>/<key>.lock|.softlock                 the per-key single-flight lock
    quarantine/<key>.<host>.<pid>.<time>.bad             entries that failed validation (shared)

No index: a lookup is one bounded read of a file named by its key, a write a temp file renamed into
place, recency the file's mtime, a listing a walk. Nothing to repair or rebuild; a damaged file is a
miss, removed (or moved aside). Every access goes through `safefs.Tree`: no link followed, no FIFO
opened, reads capped at KERNEL_CACHE_MAX_ENTRY_BYTES, names other than content keys ignored. The two
levels differ only in what they trust (`LocalLevel`: its owner; `SharedLevel`: owner or signature)
and in how they lock; the local level also keeps the size bound.

This module is long because it is a level's whole protocol, maintenance and red-team handling included.
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

from kernel_cache.coordination import locks
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, Entry, check_key, is_key, key_ok
from kernel_cache.errors import LevelUnavailable, RejectedEntry
from kernel_cache.levels import cache_marker
from kernel_cache.levels.cache_marker import ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR
from kernel_cache.sanitize import escaped
from kernel_cache.telemetry.warnings_once import info_once, warn_once
from kernel_cache.trust.safefs import Tree, UnsafeFile, host_tag, is_temp

LOCK_SUFFIXES = {"flock": ".lock", "soft": ".softlock"}  # distinct: a leftover flock file is no soft marker
READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
_FANOUT_CHARS = set("0123456789abcdef")
# raw entry bytes -> why they are not acceptable (unsigned, another key...), or None
Authenticate = Callable[[bytes], "str | None"]


class EntryFiles:
    """The Level protocol over entry files in `tree`. Subclasses open the directory, then call `_start`;
    they set `name`, `label` (for messages), `kind` and `own_names` (its marker, `cache_marker`),
    `quarantines` (move a bad entry aside for inspection, or remove it) and `touch_interval` (how stale
    an mtime may get before a use refreshes it: every refresh is a metadata write, which NFS pays for)."""

    name = ""
    label = ""
    quarantines = False
    durable = False  # fsync each publish (an entry is checksummed: one cut short is a miss either way)
    touch_interval = 60.0
    layout = (ENTRIES_DIR, LOCKS_DIR, QUARANTINE_DIR)  # the folders it makes
    kind = cache_marker.SHARED
    own_names: frozenset[str] = frozenset()
    directory: Path
    tree: Tree
    writable: bool
    lock_kind: str | None

    def _start(self, *, authenticate: Authenticate | None, max_entry_bytes: int, stale_after: float,
               read_only: bool, lock_mode: str) -> None:
        """Check the layout's folders (every level a reader relies on) and the marker, then make what
        is missing where this process may write."""
        for sub in self.layout:
            with contextlib.suppress(FileNotFoundError), self.tree.directory(sub):
                pass
        writable = not read_only and os.access(self.directory, os.W_OK)
        cache_marker.check(self.tree, self.kind, self.own_names, write=writable)
        self.authenticate = authenticate
        self.max_entry_bytes = max_entry_bytes or DEFAULT_MAX_ENTRY_BYTES
        self.stale_after = stale_after
        self._touch_lock = threading.Lock()
        self._pending_touches: set[str] = set()
        self.writable = writable and self._make_layout()
        self.lock_kind = locks.choose_lock_kind(self.tree, (LOCKS_DIR,), lock_mode) if self.writable else None

    @property
    def location(self) -> str:
        return str(self.directory)

    @property
    def mode(self) -> str:
        return "read-write" if self.writable else "read-only"

    # Lookups ------------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """The valid entry, or None. A damaged one is removed (or moved aside) and raised as
        CorruptEntry; one that fails authentication is raised as RejectedEntry and left alone."""
        parts = _entry_parts(key)
        found = self._read(parts)
        if found is None:
            return None
        data, st = found
        if self.authenticate is not None:
            problem = self.authenticate(data)
            if problem is not None:
                raise RejectedEntry(f"{self.name} entry {key[:12]} is {problem}")
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._set_aside(parts, st.st_ino)
            raise
        if time.time() - st.st_mtime >= self.touch_interval:
            self._refresh(parts)
        return entry

    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes; reading never changes recency (only `get` and `touch` do)."""
        found = self._read(_entry_parts(key))
        return None if found is None else found[0]

    def __contains__(self, key: object) -> bool:
        """One lstat: lets a waiting process notice the moment an entry is published."""
        try:
            st = self.tree.lstat(*_entry_parts(key))
        except (OSError, ValueError):
            return False
        return st is not None and stat.S_ISREG(st.st_mode)

    def keys(self) -> Iterator[str]:
        return iter([name for name, _ in self._entry_files()])

    def __len__(self) -> int:
        return sum(1 for _ in self._entry_files())

    # Writes -------------------------------------------------------------------------------
    def put(self, entry: Entry) -> None:
        self.put_raw(entry.key, entry_format.encode(entry))

    def keep(self, entry: Entry, data: bytes) -> None:
        """The store's own bytes: published as they are (its encoder made them)."""
        self._publish(entry.key, data)

    def put_raw(self, key: str, data: bytes) -> None:
        """Publish bytes from elsewhere (import, a signed copy): validated first, a bad entry must
        not reach a level."""
        entry_format.decode(data, expected_key=check_key(key))
        self._publish(key, data)

    def delete(self, key: str) -> bool:
        return self.tree.unlink(*_entry_parts(key))

    # Single-flight ------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool | None]:
        """Per-key lock across processes (and nodes, on a shared filesystem). True when held; False
        when the entry got published while waiting or the wait bound passed; None where this
        directory cannot hold a lock (read-only): compile at once."""
        key_ok(key) or check_key(key)
        if not self.writable:
            yield None
            return
        kind = self.lock_kind or "soft"
        parts = (LOCKS_DIR, key[:2], f"{key}{LOCK_SUFFIXES[kind]}")
        with locks.hold(self.tree, parts, kind, timeout, self.stale_after, done=lambda: key in self) as held:
            yield held

    # Maintenance (cachectl) ---------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created (from the entry's header, its head read alone), last_used (mtime)."""
        out = []
        for key, st in self._entry_files():
            created = None
            with contextlib.suppress(OSError, CorruptEntry):
                found = self.tree.read(ENTRIES_DIR, key[:2], key, max_bytes=self.max_entry_bytes,
                                       head=entry_format.META_PEEK_BYTES)
                created = None if found is None else entry_format.peek_meta_head(found[0], found[1].st_size).get("created")
            out.append({"key": key, "size_bytes": st.st_size, "last_used": st.st_mtime,
                        "created": float(created) if isinstance(created, (int, float)) else st.st_mtime})
        return out

    def volume(self) -> int:
        return sum(st.st_size for _, st in self._entry_files())

    def touch(self, keys: Iterable[str]) -> None:
        valid = [check_key(key) for key in keys]
        with self._touch_lock:
            self._pending_touches.update(valid)

    def flush_touches(self) -> None:
        """Refresh the mtimes of entries `touch` named whose recency is stale (one lstat each,
        paid at close or exit rather than per call)."""
        with self._touch_lock:
            keys, self._pending_touches = self._pending_touches, set()
        for key in sorted(keys):
            parts = _entry_parts(key)
            with contextlib.suppress(OSError):
                st = self.tree.lstat(*parts)
                if st is not None and stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime >= self.touch_interval:
                    self._refresh(parts)

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[tuple[str, int]]:
        """Remove planted non-files at entry paths (at once: no writer of ours makes one), and temp
        files of crashed writers, unheld lock files and quarantined entries older than the
        threshold. Returns [(path, bytes)]."""
        removed, now = [], time.time()
        for sub in self._fanout(ENTRIES_DIR):
            for name, st in self.tree.listdir(ENTRIES_DIR, sub):
                planted = is_key(name) and not stat.S_ISREG(st.st_mode)
                crashed = is_temp(name) and now - st.st_mtime > older_than_seconds
                if (planted or crashed or self._foreign(name, st)) and self._remove_any((ENTRIES_DIR, sub, name), st):
                    removed.append((os.path.join(self.directory, ENTRIES_DIR, sub, name), st.st_size))
        kinds = {suffix: kind for kind, suffix in LOCK_SUFFIXES.items()}
        for sub in self._fanout(LOCKS_DIR):
            for name, st in self.tree.listdir(LOCKS_DIR, sub):
                kind = kinds.get(os.path.splitext(name)[1])
                if kind and now - st.st_mtime > older_than_seconds and locks.remove_if_free(
                        self.tree, (LOCKS_DIR, sub, name), kind, min(self.stale_after, older_than_seconds)):
                    removed.append((os.path.join(self.directory, LOCKS_DIR, sub, name), 0))
        return removed + self.remove_quarantined(older_than_seconds)

    def _foreign(self, name: str, st: os.stat_result) -> bool:
        """Whether a name in a fan-out folder is left over from another layout (never ours)."""
        return False

    def quarantined(self) -> list[dict[str, Any]]:
        """Entries moved aside as bad: path, key, size_bytes, quarantined_at."""
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

    def close(self) -> None:
        self.flush_touches()
        self.writable = False  # what a dropped session still hands a closed level is not written
        self.tree.close()

    # Internals ----------------------------------------------------------------------------
    def _make_layout(self) -> bool:
        """Create the top-level directories; False if the directory turns out not to be writable."""
        try:
            for sub in self.layout:
                with self.tree.directory(sub, create=True):  # 0777 & ~umask; setgid is inherited
                    pass
            return True
        except UnsafeFile:
            raise
        except OSError as exc:
            if exc.errno in READ_ONLY_ERRNOS:
                return False
            raise LevelUnavailable(f"cannot use {self.label} directory {self.directory}: {exc}") from exc

    def _note_read_only(self, why: str) -> None:
        self.writable = False
        info_once(f"{self.name}-read-only:{self.directory}",
                  f"{self.label} {self.directory} is read-only ({why}): serving its entries, not writing new ones")

    def _read(self, parts: tuple[str, ...]) -> tuple[bytes, os.stat_result] | None:
        if self.tree.absent(*parts):
            return None
        for attempt in (1, 2):
            try:
                return self.tree.read(*parts, max_bytes=self.max_entry_bytes)
            except UnsafeFile as exc:
                if exc.owner:
                    raise RejectedEntry(f"{self.name} entry {parts[-1][:12]} {exc.reason}") from None
                self._set_aside(parts, None)  # a planted link, FIFO or giant: its name goes
                raise CorruptEntry(f"refused: it {exc.reason}") from None
            except OSError as exc:  # NFS: a stale handle is usually cured by opening the path again
                if exc.errno != errno.ESTALE or attempt == 2:
                    raise
                self.tree.reopen()
        return None

    def _publish(self, key: str, data: bytes) -> None:
        if not self.writable:
            return
        parts = _entry_parts(key)
        try:
            try:
                self.tree.publish(*parts, data=data, durable=self.durable)
            except IsADirectoryError:  # a directory planted at the entry's name: moved aside, once
                self._set_aside(parts, None)
                self.tree.publish(*parts, data=data, durable=self.durable)
        except UnsafeFile:
            raise
        except OSError as exc:
            if exc.errno == errno.EROFS:
                self._note_read_only(os.strerror(exc.errno))
                return
            if exc.errno in READ_ONLY_ERRNOS:
                self.writable = False  # warned once by the store; not retried per kernel
            raise
        self._published(len(data))

    def _published(self, size: int) -> None:
        """A hook for what follows a write (the local level's size bound)."""

    def _refresh(self, parts: tuple[str, ...]) -> None:
        """Record a use for the LRU order: the mtime set to now (needs write access only, unlike
        explicit times, so a group's members refresh each other's entries)."""
        if self.writable:
            with contextlib.suppress(OSError):
                self.tree.touch(*parts)

    def _set_aside(self, parts: tuple[str, ...], ino: int | None) -> None:
        """A bad entry (unless a writer replaced it meanwhile) moved to quarantine where this level
        keeps them, else removed."""
        if not self.writable:
            return
        if self.quarantines:
            name = f"{parts[-1]}.{host_tag()}.{os.getpid()}.{int(time.time())}.bad"
            with contextlib.suppress(OSError):
                if self.tree.rename(parts, (QUARANTINE_DIR, name), expect_ino=ino):
                    return
        with contextlib.suppress(OSError):  # not movable (another user's directory): remove what we can
            st = self.tree.lstat(*parts)
            if st is not None and (ino is None or st.st_ino == ino) and not self._remove_any(parts, st):
                warn_once(f"{self.name}-stuck:{parts[-1]}",
                          f"cannot move or remove {escaped(os.path.join(self.directory, *parts))}, planted at "
                          f"an entry's path: this kernel is not cached until its owner or an admin removes it")

    def _remove_any(self, parts: tuple[str, ...], st: os.stat_result) -> bool:
        """Remove a file, link, FIFO or whole directory tree found at root/parts."""
        if stat.S_ISDIR(st.st_mode):
            return self.tree.remove_tree(*parts)
        return self.tree.unlink(*parts, expect_ino=st.st_ino)

    def _fanout(self, top: str) -> list[str]:
        return [n for n, st in self.tree.listdir(top) if stat.S_ISDIR(st.st_mode) and len(n) == 2 and set(n) <= _FANOUT_CHARS]

    def _entry_files(self) -> Iterator[tuple[str, os.stat_result]]:
        """(key, lstat) of every published entry; foreign names, temp files and non-files skipped."""
        for sub in self._fanout(ENTRIES_DIR):
            for name, st in self.tree.listdir(ENTRIES_DIR, sub):
                if is_key(name) and name.startswith(sub) and stat.S_ISREG(st.st_mode):
                    yield name, st


def _entry_parts(key: object) -> tuple[str, str, str]:
    valid = key if type(key) is str and key_ok(key) else check_key(key)
    return ENTRIES_DIR, valid[:2], valid
