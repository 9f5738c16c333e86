"""Node-local persistent level: one file per entry and our own SQLite index of them (entries/index.db,
`disk_sql`), size-bounded with least-recently-used eviction.

Values are our own encoded entries (bytes), each in its own value file (entries/aa/bb/<hex>.val),
written through `safefs` (a temp file renamed into place, no link followed) before the row that names
it, which is written in one transaction; a file no row names any more (replaced, evicted) is removed
once that has committed. The index holds keys, file names, sizes and times only: it is a cache of the
files that `disk_rebuild` can always rebuild, every entry file carrying its own key. A lookup is one
SELECT on this thread's connection of its own, then the value file read through `safefs` (no
symlink, no FIFO, capped size); a row whose file is gone (a neighbour evicted it meanwhile) is a
miss. After a write, while the entries hold more than `max_bytes`, the least recently used go, a
bounded number per entry written (`cull` evicts the rest); a hit's use (the LRU order) is recorded
later, batched in one transaction (`flush_touches`).

The index is ours, not diskcache's: diskcache's public API cannot read without writing (opening a
`Cache` writes its settings, a least-recently-used `get` its access time), which neither a warm
process that only reads nor a read-only mount can afford. A directory an older kernel-cache wrote
holds diskcache's index (entries/cache.db), not ours: a process that opens it for writing upgrades
it first (`disk_old_format`, reading it through diskcache's public API, under the index lock); one
that opens it read-only treats it as not indexed yet (every read a miss) until a writer has.

Trust: the directory, its levels and the index files must be owned by you, root or the trusted
group and writable by nobody else; otherwise the level is refused (LevelUntrusted) and the store
runs from memory with one warning.

Every wait is bounded. SQLite waits at most `index_timeout` for a neighbour's write transaction
(a suspended job, an operator's sqlite3 shell); after one such timeout the level stops writing for
`BUSY_COOLDOWN` seconds (hits are still served: WAL readers do not wait for writers). When the
index cannot be written at all (read-only mount, full disk) or opened for writing, the level opens
it read-only and keeps serving hits. A damaged index (unreadable, cut to nothing, or gone while
its value files are there) is IndexDamaged: the next process that opens the level for writing
rebuilds it from the value files (`disk_repair.open_healed`, under the index lock), as
`cachectl verify --repair` does.

SQLite's locking is unreliable on network filesystems, so this level is for local disks only; the
shared level (plain files) serves multi-node clusters.

This module is long because it is one level's whole Level protocol (lookups, bounded writes, lock,
debris); the layout's checked opening lives in disk_index, the SQL in disk_sql, the index's rebuild
in disk_rebuild and disk_repair.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_cache import at_exit
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import DEFAULT_MAX_ENTRY_BYTES, CorruptEntry, Entry, check_key, is_key, key_ok
from kernel_cache.errors import IndexDamaged, IndexNotReady, LevelReadOnly, LevelUnavailable
from kernel_cache.lazy import later
from kernel_cache.levels import cache_marker
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import (
    ENTRIES_DIR,
    INDEX,
    LOCKS_DIR,
    OLD_INDEX,
    OLD_INDEX_FILES,
    STATS_DIR,
    TEMP_SUFFIX,
    VALUE_FILE,
    check_file,
    describe_error,
    has_value_files,
    open_tree,
    value_files,
)
from kernel_cache.levels.disk.sql import damage_seen_by_writer, is_damage, open_read_only, open_read_write
from kernel_cache.levels.protocols import InDirectory
from kernel_cache.settings.config import Config
from kernel_cache.telemetry.warnings_once import info_once, warn_once
from kernel_cache.trust.safefs import Owners, Tree, UnsafeFile

if TYPE_CHECKING:
    from kernel_cache.coordination import locks
    from kernel_cache.levels.disk import old_format as disk_old_format
    from kernel_cache.trust.signing import Signer
else:
    locks = later("kernel_cache.coordination.locks")  # the build lock of a miss (and cachectl's debris sweep): a hit takes none
    disk_old_format = later("kernel_cache.levels.disk.old_format")  # only where an older kernel-cache wrote the directory

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
        self._db = self.directory / ENTRIES_DIR / INDEX
        self._writer = False  # whether this process made or checked the index for writing
        self._closed = False
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
        no_index = self.tree.lstat(ENTRIES_DIR, INDEX) is None
        # an older kernel-cache's index and not ours: upgraded by the writer
        self._old_format = no_index and self.tree.lstat(ENTRIES_DIR, OLD_INDEX) is not None
        # A warm process only reads: the writer opens at the first write. So does a new cache's index (no
        # index, no entry files; an index gone while its entry files are there is damage, never replaced
        # by an empty one): every read is a miss until then, and its flush (the deferred copies, at close or
        # exit at the latest) creates it. An older kernel-cache's directory is upgraded now where this
        # process may write; read-only, every read is a miss until a writer has upgraded it.
        self._awaiting_index = no_index and (self._old_format or (not read_only and not has_value_files(self.tree)))
        if self._awaiting_index:
            if not read_only and not self._old_format:
                with self.tree.directory(ENTRIES_DIR, create=True), self.tree.directory(LOCKS_DIR, create=True), \
                        self.tree.directory(STATS_DIR, create=True):  # made here, never through a path a link could redirect
                    pass
            elif not read_only:
                self._try_writer()
        else:
            try:
                self._check_reader(confirm=not read_only)
            except LevelUnavailable as exc:
                if not read_only and not isinstance(exc, IndexDamaged):
                    self._try_writer()  # e.g. a neighbour is creating the index right now: wait as a writer does
                if not self._writer and not read_only and isinstance(exc, IndexNotReady) \
                        and not has_value_files(self.tree):
                    # a neighbour's index without its tables yet, and this writer could not wait it out: a
                    # new cache here too (every read a miss until it is readable), not one cached in memory only
                    self._awaiting_index = True
                elif not self._writer:
                    self.close()
                    raise

    # Opening ------------------------------------------------------------------------------
    def _try_writer(self) -> None:
        """Open the index for writing; on failure (a neighbour holds it, read-only mount, full
        disk) stay read-only and try again after BUSY_COOLDOWN."""
        try:
            self._open_writer()
            self._writer = True
            self._reader_epoch += 1
            self.read_only_reason = ""
            self._awaiting_index = False
        except (OSError, sqlite3.Error, ValueError) as exc:
            self.read_only_reason = describe_error(exc)
            self._reopen_at = time.monotonic() + BUSY_COOLDOWN
            return
        self.flush_touches()

    def _open_writer(self) -> None:
        """Upgrade an older kernel-cache's directory, then make the index (a new cache's) or check
        that it can be written (its schema ours): one write transaction."""
        if self._old_format:
            self._upgrade()
        elif not self._awaiting_index:  # (a new cache's directories were made at opening)
            with self.tree.directory(ENTRIES_DIR, create=True), self.tree.directory(LOCKS_DIR, create=True):
                pass
        disk_sql.open_index(self._db, self.index_timeout, self.max_bytes)

    def _upgrade(self) -> None:
        report = disk_old_format.upgrade(self.tree, self.directory, self.max_bytes, self.max_entry_bytes,
                                         self.index_timeout, write_value_file)
        self._old_format = False
        if report["indexed"] is not None:
            info_once(f"disk-upgraded:{self.directory}",
                      f"local cache {self.directory}: indexed {report['indexed']} entries of an older kernel-cache's "
                      f"index ({report['imported']} of them moved out of it into files); its cache.db removed")

    def _no_index_yet(self) -> bool:
        """Whether this cache still has no index to read (every key a miss). Asked per read while
        it has none: a neighbour (another process, or another thread's first write) may create it
        meanwhile, and it is read once it is readable, tables and all. One thread asks at a time, and
        the answer turns to "there" only once the index was read: a thread never reads an index
        another thread is still creating."""
        if not self._awaiting_index:
            return False
        with self._index_lock:
            if not self._awaiting_index:  # another thread found it meanwhile
                return False
            if not self._writer:
                if not os.path.lexists(self._db):  # a probe: nothing is read
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
            self._writer_due()
        con = getattr(self._readers, "con", None)
        if con is None or self._readers.opened != self._reader_epoch:
            self._close_reader()
            if self._writer:
                con = open_read_write(self._db, self.index_timeout)  # (the file checked as the writer opened)
            else:
                check_file(self.tree, ENTRIES_DIR, INDEX)  # SQLite would follow a link, and block on a FIFO
                con = open_read_only(self._db, self.index_timeout)
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
                seen = damage_seen_by_writer(self._db, self.index_timeout)
            elif is_damage(exc) or no_tables:
                seen = "corrupt" if is_damage(exc) else "empty"
            problem = f"cannot read the local cache index {self._db} ({describe_error(exc)})"
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
        if not self._writer and self._reopen_at is not None and time.monotonic() >= self._reopen_at:
            self._try_writer()
        return self._writer

    @property
    def writable(self) -> bool:
        return self._writer_due() and time.monotonic() >= self._busy_until

    # Lookups ------------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        """The valid entry for `key`, or None. A corrupt entry is deleted and reported."""
        key_ok(key) or check_key(key)
        data, used = self._fetch(key)
        if data is None:
            return None
        try:
            entry = entry_format.decode(data, expected_key=key)
        except CorruptEntry:
            self._drop(key)
            raise
        if time.time() - used > TOUCH_INTERVAL:
            self._touch(key)
        return entry

    def _fetch(self, key: str) -> tuple[bytes | None, float]:
        deferred = self._deferred.get(key)
        if deferred is not None:
            return deferred, time.time()  # a copy not written yet: no use to record either
        if self._no_index_yet():
            return None, 0.0
        found = disk_sql.lookup(self._reader(), key)
        if found is None:
            return None, 0.0
        try:
            data = self._value(found[0])
        except CorruptEntry:
            self._drop(key)
            raise
        return data, found[1]

    def _value(self, filename: str) -> bytes | None:
        """The bytes of a value file; None where it is gone (evicted by a neighbour since the row was read)."""
        try:
            found = self.tree.read(ENTRIES_DIR, *value_parts(filename), max_bytes=self.max_entry_bytes)
        except UnsafeFile as exc:
            raise CorruptEntry(f"value file refused: it {exc.reason}") from None
        return None if found is None else found[0]

    def get_raw(self, key: str) -> bytes | None:
        key_ok(key) or check_key(key)
        return self._fetch(key)[0]

    def peek_raw(self, key: str) -> bytes | None:
        """The stored bytes for `key` without bumping its last-used time (listing must not
        reorder the LRU)."""
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
        except (ValueError, sqlite3.Error, OSError):
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
        return (0 if reader is None else disk_sql.count_and_size(reader)[1]) + (st.st_size if st is not None else 0)

    def _indexed_reader(self) -> sqlite3.Connection | None:
        """A reader of the index, made where it can be; None for a cache with no index to read yet (a
        new one whose index could not be made, an older kernel-cache's not upgraded yet): nothing is
        indexed, every key is a miss."""
        if self._no_index_yet():
            self._writer_due()
            if self._no_index_yet():
                return None
        return self._reader(ask_index=False)

    # Writes (bounded waits) ---------------------------------------------------------------
    def _check_writable(self) -> None:
        if not self._writer_due():
            raise LevelReadOnly(f"local cache {self.directory} is read-only here ({self.read_only_reason})")
        if time.monotonic() < self._busy_until:
            raise LevelReadOnly(f"local cache index {self.directory} is held by another process; "
                               f"not writing for up to {BUSY_COOLDOWN:.0f}s")

    def _write(self, action: Callable[[], Any]) -> Any:
        """One write transaction of `disk_sql`'s; a neighbour holding the index past `index_timeout`
        (or an index SQLite cannot write) stops writes for BUSY_COOLDOWN (LevelReadOnly)."""
        self._check_writable()
        try:
            return action()
        except sqlite3.OperationalError as exc:
            self._busy_until = time.monotonic() + BUSY_COOLDOWN
            raise LevelReadOnly(f"local cache index {self.directory} could not be written within "
                               f"{self.index_timeout:.0f}s ({describe_error(exc)}); skipping writes for "
                               f"{BUSY_COOLDOWN:.0f}s") from None

    def _store(self, copies: dict[str, bytes]) -> None:
        """Write each copy's value file, then index them all in one transaction, evicting the least
        recently used beyond `max_bytes`; the files no row names any more are removed after it
        committed (a reader that read their rows before gets a miss). Files written for a transaction
        that failed are removed."""
        self._check_writable()
        now = time.time()
        rows: list[disk_sql.Row] = []
        written: list[tuple[str, str, str]] = []
        try:
            for key, data in copies.items():
                parts = write_value_file(self.tree, data)  # defined here: a cold put calls out only to publish
                written.append(parts)
                rows.append((key, "/".join(parts), len(data), now, now))
            unnamed = self._write(lambda: disk_sql.put(self._db, self.index_timeout, rows, self.max_bytes))
        except BaseException:
            for parts in written:
                with contextlib.suppress(OSError):
                    self.tree.unlink(ENTRIES_DIR, *parts)
            raise
        self._remove_files(unnamed)

    def _remove_files(self, filenames: Iterable[str]) -> None:
        for filename in filenames:
            with contextlib.suppress(CorruptEntry, OSError):
                self.tree.unlink(ENTRIES_DIR, *value_parts(filename))

    def put(self, entry: Entry) -> None:
        self.put_raw(entry.key, entry_format.encode(entry))

    def keep(self, entry: Entry, data: bytes) -> None:
        self.put_raw(entry.key, data)

    def put_raw(self, key: str, data: bytes) -> None:
        key_ok(key) or check_key(key)
        self._store({key: bytes(data)})
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
        if self._closed:
            return  # never written (see `close`)
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
                self._writer_due()  # a new cache gets its index by its close or exit at the latest
            return
        try:
            self._store({key: bytes(data) for key, data in copies.items()})
        except (LevelReadOnly, OSError, sqlite3.Error) as exc:
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
        found = disk_sql.lookup(reader, key) if reader is not None else None
        if found is None:
            return False
        filename = found[0]
        file_removed = False
        try:
            file_removed = self.tree.unlink(ENTRIES_DIR, *value_parts(filename))
        except (CorruptEntry, FileNotFoundError):
            pass  # no value file to remove: the row goes
        except OSError:
            return False  # not removable here (not yours, a read-only mount): not counted as removed
        try:
            self._write(lambda: disk_sql.delete(self._db, self.index_timeout, key, filename))
        except LevelReadOnly:
            return file_removed  # its space is freed; the row goes once the index can be written
        return True

    def _drop(self, key: str) -> None:
        with contextlib.suppress(LevelReadOnly, OSError, sqlite3.Error):
            self.delete(key)

    def _touch(self, key: str) -> None:
        """Record a hit for the LRU order: now if the index is open for writing, else at the next
        write or at exit (`flush_touches`), so a warm process never opens the writer to read."""
        with self._lock:
            self._touches[key] = time.time()
        if self._writer:
            self.flush_touches()

    def touch(self, keys: Iterable[str]) -> None:
        now = time.time()
        valid = [check_key(key) for key in keys]
        with self._lock:
            self._touches.update(dict.fromkeys(valid, now))

    def flush_touches(self) -> None:
        """Write the deferred copies (`flush_deferred`), then record the deferred uses, each with its
        own time, in one transaction. A use within TOUCH_INTERVAL of the one the index holds is
        dropped, as a hit's is (`get`): a warm process whose kernels were used a moment ago (by a
        neighbour, say) opens no writer at exit."""
        self.flush_deferred()
        with self._lock:
            touches, self._touches = self._touches, {}
        touches = self._due(touches)
        if not touches:
            return
        with contextlib.suppress(LevelReadOnly):
            self._write(lambda: disk_sql.touch(self._db, self.index_timeout, touches.items()))

    def _due(self, touches: dict[str, float]) -> dict[str, float]:
        """The uses the index holds no use within TOUCH_INTERVAL of (all of them where it cannot say)."""
        if not touches:
            return touches
        try:
            con = self._reader()
            recorded = {key: disk_sql.used_time(con, key) for key in touches}
        except (sqlite3.Error, OSError):
            return touches
        return {key: when for key, when in touches.items()
                if (at := recorded[key]) is not None and when - at > TOUCH_INTERVAL}

    def set_max_bytes(self, max_bytes: int) -> None:
        """The bound this level evicts to from now on (recorded in the index)."""
        self._write(lambda: disk_sql.set_max_bytes(self._db, self.index_timeout, max_bytes))
        self.max_bytes = max_bytes

    def cull(self) -> int:
        """Evict the least recently used entries until the rest fit in `max_bytes`; how many went."""
        evicted = self._write(lambda: disk_sql.cull(self._db, self.index_timeout, self.max_bytes))
        self._remove_files(filename for _, filename in evicted)
        return len(evicted)

    def clear(self) -> int:
        """Remove every entry; value files first (see `delete`)."""
        with self._lock:
            self._deferred, self._deferred_bytes = {}, 0
        count = len(self.listing())
        for name in value_files(self.tree):
            with contextlib.suppress(OSError):
                self.tree.unlink(ENTRIES_DIR, *name)
        self._write(lambda: disk_sql.clear(self._db, self.index_timeout))
        return count

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """A per-key lock shared by every process on this node; yields False if it timed out."""
        key_ok(key) or check_key(key)
        with locks.hold(self.tree, (LOCKS_DIR, f"{key}.lock"), "flock", timeout) as held:
            yield held

    def close(self) -> None:
        """Write what is deferred, then close; a closed level is read-only (`writable` is False), so
        what a dropped session still hands it (its warm set, saved at exit) is not written."""
        self.flush_touches()
        self._closed, self._writer, self._reopen_at, self.read_only_reason = True, False, None, "closed"
        self._close_readers()
        self.tree.close()

    # Maintenance helpers for cachectl -------------------------------------------------------
    def quarantined(self) -> list[dict[str, Any]]:
        return []  # a bad local entry is deleted at once (it is only ever this node's copy)

    def integrity_problem(self) -> str | None:
        """SQLite's own check of the index; None when it is sound (or there is no index yet)."""
        try:
            reader = self._indexed_reader()
            result = "ok" if reader is None else "; ".join(disk_sql.quick_check(reader))
        except sqlite3.Error as exc:
            return describe_error(exc)
        return None if result == "ok" else result

    def remove_debris(self, older_than_seconds: float = 3600.0) -> list[tuple[str, int]]:
        """Delete what crashed processes leave behind: value files no index row points to, value
        files half written, lock files and an older kernel-cache's index an upgrade did not get to
        remove, all only once older than `older_than_seconds` (a live writer's files are seconds
        old). Returns [(path, bytes)] removed."""
        cutoff = time.time() - older_than_seconds
        reader = self._indexed_reader()
        if reader is None:
            return []  # no index to tell what is referenced: nothing is debris yet
        referenced = {os.path.normpath(f) for f in disk_sql.value_filenames(reader)}
        removed = []
        orphans = [parts for parts in value_files(self.tree) if os.path.normpath("/".join(parts)) not in referenced]
        for parts in [*orphans, *value_files(self.tree, temp=True), *((name,) for name in OLD_INDEX_FILES)]:
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


def write_value_file(tree: Tree, data: bytes) -> tuple[str, str, str]:
    """Write `data` as a new value file under entries/ and return its (aa, bb, name.val): a name of
    128 random bits (never one in use), written as a temp file beside it (`.<name>.<pid>.<hex>.tmp`,
    TEMP_SUFFIX) renamed into place. No fsync: an entry is checksummed, one cut short by a power
    cut is a miss."""
    name = secrets.token_hex(16)
    parts = (name[:2], name[2:4], name[4:] + ".val")
    temp = f".{parts[2]}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    tree.publish(ENTRIES_DIR, *parts, data=data, temp_name=temp, durable=False)
    return parts


def value_parts(filename: object) -> tuple[str, str, str]:
    """(subdirectory, name, suffix) of the value file an index row names; CorruptEntry for any other name."""
    match = VALUE_FILE.fullmatch(str(filename or ""))
    if match is None:
        raise CorruptEntry(f"index names an implausible value file {str(filename)[:60]!r}")
    return match.group(1), match.group(2), match.group(3)


def location_in(config: Config) -> str:
    """Where the local level of `config` lives (for a message about a level that did not open)."""
    return str(config.dir)
