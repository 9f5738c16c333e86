"""Node-local persistent level on diskcache (SQLite index + files), size-bounded with LRU eviction.

Values are our own encoded entries (bytes), stored raw, each in its own value file: the index holds
keys, sizes and times only, so it is a cache of the files that `rebuild_index` can always rebuild
(entries an older kernel-cache kept inside the index move to files when the writer opens). What diskcache would unpickle is never
loaded: `RawOnlyDisk` refuses every pickled or text row (a hostile row is a corrupt entry, not
code to run), and lookups read the index on a connection of our own (`disk_sql`: diskcache's
public API cannot read without writing) and the value file through `safefs` (no symlink, no FIFO,
capped size). Writes go through diskcache's public API (set, delete, cull, clear; a hit's LRU
touch is a `Cache.get`, deferred and batched in one transaction).

Trust: the directory, its levels and the index files must be owned by you, root or the trusted
group and writable by nobody else; otherwise the level is refused (LevelUntrusted) and the store
runs from memory with one warning.

Every wait is bounded. SQLite waits at most `index_timeout` for a neighbour's write transaction
(a suspended job, an operator's sqlite3 shell); after one such timeout the level stops writing for
`BUSY_COOLDOWN` seconds (hits are still served: WAL readers do not wait for writers). When the
index cannot be written at all (read-only mount, full disk) or opened for writing, the level opens
it read-only and keeps serving hits. A damaged index (unreadable, cut to nothing, or gone while
its value files are there) is IndexDamaged: the next process that opens the level for writing
rebuilds it from the value files, every entry carrying its own key (`disk_repair.open_healed`, under
the index lock), as `cachectl verify --repair` does.

diskcache's SQLite locking is unreliable on network filesystems, so this level is for local disks
only; the shared level (plain files) serves multi-node clusters.

This module is long because it is one level's whole Level protocol (lookups, bounded writes, lock,
debris); the index's safe opening lives in disk_index, its repair in disk_repair and what reads
diskcache's tables in disk_sql.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import diskcache

from kernel_cache import at_exit
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, Entry, check_key, is_key, key_ok
from kernel_cache.errors import IndexDamaged, IndexNotReady, LevelReadOnly, LevelUnavailable
from kernel_cache.lazy import later
from kernel_cache.level import InDirectory
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import (
    ENTRIES_DIR,
    INDEX,
    LOCKS_DIR,
    STATS_DIR,
    VALUE_FILE,
    RawOnlyDisk,
    describe_error,
    has_value_files,
    open_index,
    open_tree,
    value_files,
)
from kernel_cache.levels.disk.sql import damage_seen_by_writer, is_damage, open_read_only, open_read_write
from kernel_cache.settings.config import Config
from kernel_cache.telemetry.warnings_once import warn_once
from kernel_cache.trust import cache_marker
from kernel_cache.trust.safefs import Owners, UnsafeFile

if TYPE_CHECKING:
    from kernel_cache.coordination import locks
    from kernel_cache.trust.signing import Signer
else:
    locks = later("kernel_cache.coordination.locks")  # the build lock of a miss (and cachectl's debris sweep): a hit takes none

# Levels holding deferred copies (`keep_later`), written at exit by `_flush_at_exit` where no close
# wrote them first (a Store opened directly and never closed, as well as the process's session).
_unflushed: set[DiskLevel] = set()
_unflushed_lock = threading.Lock()

BUSY_COOLDOWN = 60.0  # after a busy timeout, skip writes this long instead of waiting per kernel
TOUCH_INTERVAL = 60.0  # record a hit in the index at most this often per entry (LRU granularity)
MAX_DEFERRED_BYTES = 64 << 20  # hits' copies (`keep_later`) held before they are written at once


class DiskLevel(InDirectory):
    name = "disk"

    def __init__(self, directory: Path, max_bytes: int = 8 << 30, *, owners: Owners | None = None,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, index_timeout: float = 30.0,
                 read_only: bool = False):
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_entry_bytes
        self.index_timeout = index_timeout
        self.tree = open_tree(self.directory, owners, create=not read_only)
        try:
            cache_marker.check(self.tree, cache_marker.LOCAL, cache_marker.LOCAL_NAMES, write=not read_only)
        except BaseException:
            self.tree.close()
            raise
        self._cache: diskcache.Cache | None = None
        self._lock = threading.Lock()
        self._index_lock = threading.Lock()  # one thread at a time asks whether a new cache's index is there
        self._readers = threading.local()
        # bumped when the writer opens or the level closes: a thread's reader from before reads anew
        self._reader_epoch = 0
        self._reader_cons: dict[threading.Thread, sqlite3.Connection] = {}  # each thread's open reader
        self._readers_lock = threading.Lock()  # guards _reader_cons (a leaf: nothing is taken under it)
        self._busy_until = 0.0
        self._reopen_at = None if read_only else 0.0  # when to try opening for writing again
        self.read_only_reason = "opened read-only" if read_only else ""
        self._touches: dict[str, float] = {}  # uses not yet recorded in the index (key -> when): hits, and
        # kernels a call record served (`touch`)
        self._deferred: dict[str, bytes] = {}  # hits' copies not yet written (`keep_later`), served from here
        self._deferred_bytes = 0
        # A warm process only reads: the writer (diskcache's set-up, some 70 statements) opens
        # at the first write. So does a new cache's (no index, no entry files; an index gone while its
        # entry files are there is damage, never replaced by an empty one): every read is a miss until
        # then, and its flush (the deferred copies, at close or exit at the latest) creates it.
        self._awaiting_index = (not read_only and self.tree.lstat(ENTRIES_DIR, INDEX) is None
                                and not has_value_files(self.tree))
        self._index_path = str(self.directory / ENTRIES_DIR / INDEX)
        if self._awaiting_index:
            with self.tree.directory(ENTRIES_DIR, create=True), self.tree.directory(LOCKS_DIR, create=True), \
                    self.tree.directory(STATS_DIR, create=True):  # made here, never through a path a link could redirect
                pass
        elif self._cache is None:
            try:
                self._check_reader(confirm=not read_only)
            except LevelUnavailable as exc:
                if not read_only and not isinstance(exc, IndexDamaged):
                    self._try_writer()  # e.g. a neighbour is creating the index right now: wait as a writer does
                if self._cache is None and not read_only and isinstance(exc, IndexNotReady) \
                        and not has_value_files(self.tree):
                    # a neighbour's index without its tables yet, and this writer could not wait it out: a
                    # new cache here too (every read a miss until it is readable), not one cached in memory only
                    self._awaiting_index = True
                elif self._cache is None:
                    self.close()
                    raise

    # Opening ------------------------------------------------------------------------------
    def _try_writer(self) -> None:
        """Open the index for writing; on failure (a neighbour holds it, read-only mount, full
        disk) stay read-only and try again after BUSY_COOLDOWN."""
        new = self._awaiting_index  # its directories made at opening, no values kept inline by anyone
        try:
            if not new:
                with self.tree.directory(ENTRIES_DIR, create=True), self.tree.directory(LOCKS_DIR, create=True):
                    pass
            self._cache = self._open_writer()
            self._reader_epoch += 1
            self.read_only_reason = ""
            self._awaiting_index = False
        except (OSError, sqlite3.Error, diskcache.Timeout) as exc:
            self.read_only_reason = describe_error(exc)
            self._reopen_at = time.monotonic() + BUSY_COOLDOWN
            return
        self.flush_touches()
        if not new:
            with contextlib.suppress(LevelReadOnly):
                self._write(self._move_inline_values)

    def _open_writer(self) -> diskcache.Cache:
        return open_index(self.directory / ENTRIES_DIR, self.index_timeout, **index_settings(self.max_bytes))

    def _no_index_yet(self) -> bool:
        """Whether this new cache still has no index to read (every key a miss). Asked per read while
        it has none: a neighbour (another process, or another thread's first write) may create it
        meanwhile, and it is read once it is readable, tables and all. One thread asks at a time, and
        the answer turns to "there" only once the index was read: a thread never reads an index
        another thread is still creating."""
        if not self._awaiting_index:
            return False
        with self._index_lock:
            if not self._awaiting_index:  # another thread found it meanwhile
                return False
            if self._cache is None:
                if not os.path.lexists(self._index_path):  # a probe: nothing is read
                    return True
                try:
                    self._check_reader(ask_index=False)
                except IndexDamaged:
                    pass  # read as it is: reads fail and say so, as on any damaged index
                except LevelUnavailable:
                    return True  # being created right now (no tables yet): a miss, asked again next time
            self._awaiting_index = False
            return False

    def _reader(self, ask_index: bool = True) -> sqlite3.Connection:
        """This thread's connection for reading the index: read-only until the writer opens, then one
        that sees the index (its journal included) as the writer does. A new cache's index is made
        here, by opening the writer, when something other than a lookup needs it (a listing).
        `ask_index`: False where `_no_index_yet` itself checks the index."""
        if ask_index and self._awaiting_index and self._no_index_yet():
            self._try_writer()
        con = getattr(self._readers, "con", None)
        if con is None or self._readers.opened != self._reader_epoch:
            self._close_reader()
            db = self.directory / ENTRIES_DIR / INDEX
            con = open_read_only(db, self.index_timeout) if self._cache is None else \
                open_read_write(db, self.index_timeout)
            self._readers.con, self._readers.opened = con, self._reader_epoch
            with self._readers_lock:
                self._reader_cons[threading.current_thread()] = con
        return con

    def _check_reader(self, confirm: bool = False, ask_index: bool = True) -> None:
        """Raises IndexDamaged when the index is damaged, cut to nothing or gone while entry files are
        there (rebuilt from them), IndexNotReady when the reader finds no tables in it (a neighbour
        may be creating it), LevelUnavailable when it cannot be read otherwise. `confirm`: a
        damage the reader sees is one only if a writer's connection sees it too (see
        `damage_seen_by_writer`): a writing process must never rebuild a healthy index."""
        try:
            disk_sql.probe(self._reader(ask_index))
        except (sqlite3.Error, OSError) as exc:
            self._close_reader()
            seen: str | None = None  # "corrupt", "empty" (no table, or no index at all) or None: not damage
            no_tables = "no such table" in str(exc)
            if isinstance(exc, FileNotFoundError):
                seen = "empty"
            elif (is_damage(exc) or no_tables) and confirm:
                seen = damage_seen_by_writer(self.directory / ENTRIES_DIR / INDEX, self.index_timeout)
            elif is_damage(exc) or no_tables:
                seen = "corrupt" if is_damage(exc) else "empty"
            problem = f"cannot read the local cache index {self.directory / ENTRIES_DIR / INDEX} ({describe_error(exc)})"
            message = f"{problem}; 'cachectl verify --repair' rebuilds it from the entry files"
            if seen == "corrupt" or (seen == "empty" and has_value_files(self.tree)):
                raise IndexDamaged(message, problem) from None
            raise (IndexNotReady if no_tables else LevelUnavailable)(message) from None

    def _close_reader(self) -> None:
        con = getattr(self._readers, "con", None)
        if con is not None:
            with self._readers_lock:
                if self._reader_cons.get(threading.current_thread()) is con:
                    del self._reader_cons[threading.current_thread()]
            con.close()
            self._readers.con = None

    def _close_readers(self) -> None:
        """Every thread's reader (a compile worker's, a test thread's: theirs would otherwise wait for
        the collector, which warns of each on Python 3.13). The level is closed: no thread reads
        through it after (its directory handles close too), and SQLite's serialized mode
        (`sqlite3.threadsafety` 3) lets one thread close what another opened."""
        self._close_reader()
        with self._readers_lock:
            self._reader_epoch += 1
            cons = list(self._reader_cons.values())
            self._reader_cons.clear()
        for con in cons:
            con.close()

    def _writer_due(self) -> bool:
        """Open the writer if it is not open and may be tried now (lazily in a warm process, again after a
        failure's cooldown); whether it is open."""
        if self._cache is None and self._reopen_at is not None and time.monotonic() >= self._reopen_at:
            self._try_writer()
        return self._cache is not None

    def open_writer(self) -> bool:
        """Open the index for writing now (a rebuilt index: the values kept inside it move to files);
        whether it is open."""
        return self._writer_due()

    @property
    def writable(self) -> bool:
        return self._writer_due() and time.monotonic() >= self._busy_until

    # Lookups ------------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """The valid entry for `key`, or None. A corrupt entry is deleted and reported."""
        key_ok(key) or check_key(key)
        data, access_time = self._fetch(key)
        if data is None:
            return None
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._drop(key)
            raise
        if time.time() - access_time > TOUCH_INTERVAL:
            self._touch(key)
        return entry

    def _fetch(self, key: str) -> tuple[bytes | None, float]:
        deferred = self._deferred.get(key)
        if deferred is not None:
            return deferred, time.time()  # a copy not written yet: no use to record either
        if self._no_index_yet():
            return None, 0.0
        row = disk_sql.lookup(self._reader(), key)
        if row is None:
            return None, 0.0
        try:
            data = self._value(row)
        except CorruptEntry:
            self._drop(key)
            raise
        return data, row.access_time

    def _value(self, row: disk_sql.Row) -> bytes | None:
        if row.mode == diskcache.core.MODE_RAW and isinstance(row.value, bytes):
            if len(row.value) > self.max_entry_bytes:
                raise CorruptEntry(f"index value of {len(row.value)} bytes is over KERNEL_CACHE_MAX_ENTRY_BYTES")
            return row.value
        if row.mode == diskcache.core.MODE_BINARY:
            try:
                found = self.tree.read(ENTRIES_DIR, *value_parts(row.filename), max_bytes=self.max_entry_bytes)
            except UnsafeFile as exc:
                raise CorruptEntry(f"value file refused: it {exc.reason}") from None
            return None if found is None else found[0]
        raise CorruptEntry("a row stored as pickle or text: not written by kernel-cache, never loaded")

    def get_raw(self, key: str) -> bytes | None:
        key_ok(key) or check_key(key)
        return self._fetch(key)[0]

    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes for `key` without bumping its last-used time (listing must not
        reorder the LRU); a pickled or text row raises CorruptEntry, never loaded."""
        return self.get_raw(key)

    def present(self, keys: Sequence[str]) -> set[str]:
        """Which of `keys` the index holds (or are deferred copies), asked in one query per 500 keys."""
        valid = [check_key(key) for key in keys]
        found = {key for key in valid if key in self._deferred}
        if not self._no_index_yet():
            found.update(disk_sql.present(self._reader(), [k for k in valid if k not in found]))
        return found

    def __contains__(self, key: object) -> bool:
        try:
            if not (type(key) is str and key_ok(key)):
                return False
            return key in self._deferred or (not self._no_index_yet() and disk_sql.contains(self._reader(), key))
        except (ValueError, sqlite3.Error):
            return False

    def keys(self) -> Iterator[str]:
        return iter([r["key"] for r in self.listing()])

    def __len__(self) -> int:
        return len(self.listing())

    def listing(self) -> list[dict[str, Any]]:
        """Per entry: key, size_bytes, created, last_used (epoch seconds), without reading blobs.
        Rows under names that are not content keys are not ours and are left out."""
        reader = self._indexed_reader()
        return [] if reader is None else [{"key": k, "size_bytes": s, "created": st, "last_used": at}
                                          for k, s, st, at in disk_sql.listing(reader) if isinstance(k, str) and is_key(k)]

    def volume(self) -> int:
        st = self.tree.lstat(ENTRIES_DIR, INDEX)
        reader = self._indexed_reader()
        return (0 if reader is None else disk_sql.total_size(reader)) + (st.st_size if st is not None else 0)

    def _indexed_reader(self) -> sqlite3.Connection | None:
        """A reader of the index, made where it can be; None for a new cache whose index could not
        be made (a full disk at first use): nothing is indexed, every key is a miss."""
        reader = self._reader()
        return None if self._no_index_yet() else reader

    # Writes (bounded waits) ---------------------------------------------------------------
    def _write(self, action: Callable[[diskcache.Cache], Any]) -> Any:
        if not self._writer_due():
            raise LevelReadOnly(f"local cache {self.directory} is read-only here ({self.read_only_reason})")
        if time.monotonic() < self._busy_until:
            raise LevelReadOnly(f"local cache index {self.directory} is held by another process; "
                               f"not writing for up to {BUSY_COOLDOWN:.0f}s")
        try:
            return action(self._cache)
        except (diskcache.Timeout, sqlite3.OperationalError) as exc:
            self._busy_until = time.monotonic() + BUSY_COOLDOWN
            raise LevelReadOnly(f"local cache index {self.directory} could not be written within "
                               f"{self.index_timeout:.0f}s ({describe_error(exc)}); skipping writes for "
                               f"{BUSY_COOLDOWN:.0f}s") from None

    def put(self, entry: Entry) -> None:
        self.put_raw(entry.key, entry_format.encode(entry))

    def keep(self, entry: Entry, data: bytes) -> None:
        self.put_raw(entry.key, data)

    def put_raw(self, key: str, data: bytes) -> None:
        key_ok(key) or check_key(key)
        self._write(lambda cache: cache.set(key, bytes(data), retry=False))
        with self._lock:
            self._forget_deferred(key)  # written now: an older copy must not overwrite it at the flush
        self.flush_deferred()  # the writer is open: the hits' copies go with it

    def keep_later(self, entry: Entry, data: bytes) -> None:
        """A hit's copy, written with the others in one transaction at this level's next write, its
        close or the process's exit (`flush_deferred`), or once they hold MAX_DEFERRED_BYTES: a fresh
        node served by the cluster neither creates its index nor writes per hit while it lowers.
        Served from here meanwhile; a process killed before that loses only these copies (the level
        it read them from still holds them)."""
        key = entry.key
        key_ok(key) or check_key(key)
        with self._lock:
            self._forget_deferred(key)
            self._deferred[key] = data
            self._deferred_bytes += len(data)
            due = self._deferred_bytes >= MAX_DEFERRED_BYTES
        _written_at_exit(self)
        if due:
            self.flush_deferred()

    def _forget_deferred(self, key: str) -> None:
        """Drop a deferred copy (under `_lock`)."""
        old = self._deferred.pop(key, None)
        if old is not None:
            self._deferred_bytes -= len(old)

    def flush_deferred(self) -> None:
        """Write the deferred copies in one transaction (opening the writer where it is not open:
        a new cache's index is created here, copies or not). Where the level cannot be written
        they are dropped, said once."""
        with self._lock:
            copies, self._deferred, self._deferred_bytes = self._deferred, {}, 0
        with _unflushed_lock:
            _unflushed.discard(self)
        if not copies:
            if self._no_index_yet():
                self._try_writer()  # a new cache gets its index by its close or exit at the latest
            return

        def write(cache: diskcache.Cache) -> None:
            with cache.transact(retry=False):
                for key, data in copies.items():
                    cache.set(key, bytes(data), retry=False)

        try:
            self._write(write)
        except (LevelReadOnly, OSError) as exc:
            warn_once(f"disk-deferred:{self.directory}:{type(exc).__name__}",
                      f"copying {len(copies)} entries into the local cache failed ({exc}); they stay where they "
                      f"were read from")

    def delete(self, key: str) -> bool:
        """Remove the entry. Its value file goes first: on a full disk that frees the space the
        index needs to record the deletion."""
        key_ok(key) or check_key(key)
        with self._lock:
            self._forget_deferred(key)
        reader = self._indexed_reader()
        row = disk_sql.lookup(reader, key) if reader is not None else None
        if row is None:
            return False
        file_removed = False
        if row.filename:
            try:
                file_removed = self.tree.unlink(ENTRIES_DIR, *value_parts(row.filename))
            except (CorruptEntry, FileNotFoundError):
                pass  # no value file to remove: the row goes
            except OSError:
                return False  # not removable here (not yours, a read-only mount): not counted as removed
        try:
            self._write(lambda cache: cache.delete(key, retry=False))
        except LevelReadOnly:
            return file_removed  # its space is freed; the row goes once the index can be written
        return True

    def _drop(self, key: str) -> None:
        with contextlib.suppress(LevelReadOnly, OSError):
            self.delete(key)

    def _touch(self, key: str) -> None:
        """Record a hit for the LRU order: now if the index is open for writing, else at the next
        write or at exit (`flush_touches`), so a warm process never opens the writer to read."""
        with self._lock:
            self._touches[key] = time.time()
        if self._cache is not None:
            self.flush_touches()

    def touch(self, keys: Iterable[str]) -> None:
        now = time.time()
        valid = [check_key(key) for key in keys]
        with self._lock:
            self._touches.update(dict.fromkeys(valid, now))

    def flush_touches(self) -> None:
        """Write the deferred copies (`flush_deferred`), then record the deferred uses, oldest first,
        in one transaction: each a `Cache.get`, which under
        the least-recently-used policy stamps the entry's access time (with the flush's time: a use
        is recorded at most that much later) and reads no value file (`RawOnlyDisk.fetch`). A use
        within TOUCH_INTERVAL of the one the index holds is dropped, as a hit's is (`get`): a warm
        process whose kernels were used a moment ago (by a neighbour, say) opens no writer at exit."""
        self.flush_deferred()
        with self._lock:
            touches, self._touches = self._touches, {}
        touches = self._due(touches)
        if not touches:
            return

        def write(cache: diskcache.Cache) -> None:
            with cache.transact(retry=False):
                for key in sorted(touches, key=touches.__getitem__):
                    with contextlib.suppress(CorruptEntry):  # a pickled row: never loaded, not touched
                        cache.get(key, retry=False)

        with contextlib.suppress(LevelReadOnly):
            self._write(write)

    def _due(self, touches: dict[str, float]) -> dict[str, float]:
        """The uses the index holds no use within TOUCH_INTERVAL of (all of them where it cannot say)."""
        if not touches:
            return touches
        try:
            con = self._reader()
            recorded = {key: disk_sql.access_time(con, key) for key in touches}
        except (sqlite3.Error, OSError):
            return touches
        return {key: when for key, when in touches.items()
                if (at := recorded[key]) is not None and when - at > TOUCH_INTERVAL}

    def set_max_bytes(self, max_bytes: int) -> None:
        self._write(lambda cache: cache.reset("size_limit", max_bytes))

    def cull(self) -> int:
        return int(self._write(lambda cache: cache.cull(retry=False)))

    def clear(self) -> int:
        """Remove every entry; value files first (see `delete`)."""
        with self._lock:
            self._deferred, self._deferred_bytes = {}, 0
        count = len(self.listing())
        for name in value_files(self.tree):
            with contextlib.suppress(OSError):
                self.tree.unlink(ENTRIES_DIR, *name)
        self._write(_clear)
        return count

    def _move_inline_values(self, cache: diskcache.Cache) -> int:
        """Entries an older kernel-cache kept inside the index (diskcache's default for values under
        32 KiB) move to value files, then get their own times back; returns how many moved."""
        moved = []
        for key, value, stored, used in disk_sql.inline_values(self._reader()):
            if isinstance(key, str) and is_key(key) and isinstance(value, bytes):
                cache.set(key, bytes(value), retry=False)
                moved.append((key, stored, used))
        if moved:
            with disk_sql.writing(self.directory / ENTRIES_DIR / INDEX, self.index_timeout) as con:
                for key, stored, used in moved:
                    disk_sql.set_times(con, key, stored, used)
        return len(moved)

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """A per-key lock shared by every process on this node; yields False if it timed out."""
        key_ok(key) or check_key(key)
        with locks.hold(self.tree, (LOCKS_DIR, f"{key}.lock"), "flock", timeout) as held:
            yield held

    def close(self) -> None:
        self.flush_touches()
        if self._cache is not None:
            self._cache.close()
        self._close_readers()
        self.tree.close()

    # Maintenance helpers for cachectl -------------------------------------------------------
    def quarantined(self) -> list[dict[str, Any]]:
        return []  # a bad local entry is deleted at once (it is only ever this node's copy)

    def integrity_problem(self) -> str | None:
        """SQLite's own check of the index; None when it is sound."""
        try:
            result = "; ".join(disk_sql.quick_check(self._reader()))
        except sqlite3.Error as exc:
            return describe_error(exc)
        return None if result == "ok" else result

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[tuple[str, int]]:
        """Delete what crashed processes leave behind: value files no index row points to and
        lock files, both only once older than `older_than_seconds` (a live writer's files are
        seconds old). Returns [(path, bytes)] removed."""
        cutoff = time.time() - older_than_seconds
        reader = self._indexed_reader()
        if reader is None:
            return []  # no index to tell what is referenced: nothing is debris yet
        referenced = {os.path.normpath(f) for f in disk_sql.value_filenames(reader)}
        removed = []
        for parts in value_files(self.tree):
            if os.path.normpath("/".join(parts)) in referenced:
                continue
            st = self.tree.lstat(ENTRIES_DIR, *parts)
            if st is not None and st.st_mtime < cutoff and self.tree.unlink(ENTRIES_DIR, *parts):
                removed.append((os.path.join(self.directory, ENTRIES_DIR, *parts), st.st_size))
        for name, st in self.tree.listdir(LOCKS_DIR):
            if name.endswith(".lock") and st.st_mtime < cutoff and locks.remove_if_free(
                    self.tree, (LOCKS_DIR, name), "flock", older_than_seconds):
                removed.append((os.path.join(self.directory, LOCKS_DIR, name), st.st_size))
        return removed


def _written_at_exit(level: DiskLevel) -> None:
    """Have `level`'s deferred copies written at exit unless a flush writes them first."""
    with _unflushed_lock:
        _unflushed.add(level)
    if "deferred copies" not in at_exit.added:  # (a session adds it when it opens)
        at_exit.add("deferred copies", flush_at_exit)


def flush_at_exit() -> None:
    with _unflushed_lock:
        levels = list(_unflushed)
    for level in levels:
        with contextlib.suppress(Exception):
            level.flush_deferred()


def index_settings(max_bytes: int) -> dict[str, Any]:
    """diskcache's settings for the index (its writer's, and a rebuilt one's).
    disk_min_file_size=0: every value in a file, none inside SQLite (a damaged index loses nothing)."""
    return {"disk": RawOnlyDisk, "size_limit": max_bytes, "eviction_policy": "least-recently-used",
            "cull_limit": 10, "statistics": False, "disk_min_file_size": 0}


def _clear(cache: diskcache.Cache) -> None:
    with cache.transact(retry=False):  # one transaction: diskcache's clear removes rows a hundred at a time
        cache.clear(retry=False)


def open_from_config(config: Config, owners: Owners, signer: Signer | None, read_only: bool) -> DiskLevel | None:
    """The local level KERNEL_CACHE_DIR names (None: not configured)."""
    if config.dir is None:
        return None
    level = DiskLevel(config.dir, config.max_bytes, owners=owners, max_entry_bytes=config.max_entry_bytes,
                    index_timeout=config.index_timeout, read_only=read_only)
    if level.read_only_reason and not read_only:
        warn_once(f"disk-read-only:{config.dir}",
                  f"local cache {config.dir} cannot be written ({level.read_only_reason}): serving its "
                  f"entries, new kernels stay in memory")
    return level


def value_parts(filename: object) -> tuple[str, str, str]:
    """(subdirectory, name, suffix) of the value file an index row names; CorruptEntry for any other name."""
    match = VALUE_FILE.fullmatch(str(filename or ""))
    if match is None:
        raise CorruptEntry(f"index names an implausible value file {str(filename)[:60]!r}")
    return match.group(1), match.group(2), match.group(3)


def location_in(config: Config) -> str:
    """Where the local level of `config` lives (for a message about a level that did not open)."""
    return str(config.dir)
