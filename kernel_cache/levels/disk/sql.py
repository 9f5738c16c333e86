"""diskcache's SQLite tables, read and written directly: the one module of kernel-cache that does so.

Everything else on the local level goes through diskcache's public API (`Cache.set`, `delete`,
`cull`, `clear`, `reset`, `transact`; the LRU touch is `Cache.get` under the least-recently-used
policy; values are stored and fetched by `disk_index.RawOnlyDisk`, a `diskcache.Disk`). This module
holds what that API cannot serve, written against diskcache `WRITTEN_AGAINST` and its schema
(`COLUMNS`); `tests/core/test_disk_sql.py` fails on any other diskcache version, so that someone checks
the statements below against the new schema before changing the pin:

- Reading without writing. `diskcache.Cache()` creates its tables and writes its settings when it
  opens, so it cannot open an index on a read-only mount, and a warm process that only reads would
  take the index's write lock to start; under the least-recently-used policy `Cache.get` also
  updates the row in a write transaction on every hit. The level's lookups (the warm read path), its
  presence probe and its listings read through a connection of our own (`open_read_only`, or
  `open_read_write` where the process writes: it sees the index as its writer does).
- What the API does not expose without reading every value: an entry's size, store and access
  times (`listing`), the name of its value file (`lookup`: the level reads the file through safefs,
  never through diskcache's `open()`, which follows links), the value files the index names
  (`value_filenames`: debris) and the entries' total size.
- Times kept. Entries an older kernel-cache kept inside the index move to files (`Cache.set`),
  then get back their own store and access times (`set_times`); a rebuilt index points at value
  files already in place with their times (`insert_value_file`). `Cache.set` would stamp every one
  of them now (losing `created` and the LRU order) and write a second copy of each file.
- SQLite's own: the wait for a neighbour's write transaction before diskcache's set-up (which retries
  each statement for 60 s), damage detection, `PRAGMA quick_check`, the checkpoint of a rebuilt index.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from diskcache.core import MODE_BINARY, MODE_RAW

WRITTEN_AGAINST = "5.6.3"  # the diskcache version whose schema this module reads and writes
COLUMNS = ("rowid", "key", "raw", "store_time", "expire_time", "access_time", "access_count", "tag", "size",
           "mode", "filename", "value")  # diskcache's Cache table, in its order

_DAMAGE_CODES = (11, 26)  # SQLITE_CORRUPT ("disk image is malformed"), SQLITE_NOTADB ("not a database")


# Connections ----------------------------------------------------------------------------------
def open_read_only(db: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection; on a read-only mount where SQLite cannot create the WAL's shared
    memory file, fall back to `immutable` (nobody can be writing there anyway)."""
    if not db.is_file():
        raise FileNotFoundError(f"no index at {db}")
    uri = f"file:{quote(str(db))}?mode=ro"
    con = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False, isolation_level=None)
    try:
        probe(con)
        return con
    except sqlite3.OperationalError as exc:
        con.close()
        if "locked" in str(exc):
            raise
    return sqlite3.connect(f"file:{quote(str(db))}?immutable=1", uri=True, timeout=timeout,
                           check_same_thread=False, isolation_level=None)


def open_read_write(db: Path, timeout: float) -> sqlite3.Connection:
    """A connection that sees the index (its journal included) as a writer does; never creates it."""
    return sqlite3.connect(f"file:{quote(str(db))}?mode=rw", uri=True, timeout=timeout,
                           check_same_thread=False, isolation_level=None)


@contextlib.contextmanager
def writing(db: Path, timeout: float, synchronous: int | None = None,
            create: bool = False) -> Iterator[sqlite3.Connection]:
    """One write transaction on a connection of our own (waiting at most `timeout` for a neighbour's):
    committed on success, rolled back on an error; the connection is closed after. `synchronous`:
    the connection's SQLite synchronous level (None: SQLite's default, FULL). `create`: a database
    not there yet is made, in write-ahead-log mode (its readers never wait for a writer)."""
    made = create and not db.exists()
    con = sqlite3.connect(f"file:{quote(str(db))}?mode={'rwc' if create else 'rw'}", uri=True, timeout=timeout,
                          check_same_thread=False, isolation_level=None)
    try:
        if made:
            con.execute("PRAGMA journal_mode = WAL")
        if synchronous is not None:
            con.execute(f"PRAGMA synchronous = {int(synchronous)}")
        con.execute("BEGIN IMMEDIATE")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    finally:
        con.close()


def wait_for_writers(db: Path, timeout: float) -> None:
    """Wait at most `timeout` for a neighbour's write transaction on an existing index (sqlite3's
    OperationalError if it is still held)."""
    con = sqlite3.connect(str(db), timeout=timeout, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
    finally:
        con.close()


def checkpoint(con: sqlite3.Connection) -> None:
    """Everything in the write-ahead log written into the index file itself (before it is moved)."""
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")


# Damage -----------------------------------------------------------------------------------------
def probe(con: sqlite3.Connection) -> None:
    """Read the index's table once: raises what a damaged, empty or busy index raises."""
    con.execute("SELECT count(*) FROM Cache").fetchone()


def is_damage(exc: BaseException) -> bool:
    """Whether an error reading the index says its file is damaged (cut short, overwritten), not
    that it is busy, unreadable for us or being created."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.DatabaseError) and isinstance(code, int) and code & 0xFF in _DAMAGE_CODES


def damage_seen_by_writer(db: Path, timeout: float) -> str | None:
    """How the index at `db` is damaged as a writer sees it, its journal included: "corrupt" (not a
    database, cut short), "empty" (no table: cut to nothing, or being created right now) or None
    (readable, busy, or not openable here). A reader's error alone does not say: one that cannot use
    the journal reads the file without it (a healthy index mid-checkpoint, or before its first one)."""
    try:
        con = open_read_write(db, timeout)
    except sqlite3.Error:
        return None
    try:
        probe(con)
        return None
    except sqlite3.Error as exc:
        if is_damage(exc):
            return "corrupt"
        return "empty" if "no such table" in str(exc) else None
    finally:
        con.close()


def quick_check(con: sqlite3.Connection) -> list[str]:
    """SQLite's own check of the index: ["ok"] when it is sound, else its first problems."""
    return [str(row[0]) for row in con.execute("PRAGMA quick_check").fetchmany(5)]


# Reads ------------------------------------------------------------------------------------------
class Row(NamedTuple):
    mode: int
    filename: str | None
    value: Any  # inline bytes (an older kernel-cache's), else None
    access_time: float


def lookup(con: sqlite3.Connection, key: str) -> Row | None:
    """The index row of `key` (stored under a raw key), without its value file read."""
    found = con.execute("SELECT mode, filename, value, access_time FROM Cache WHERE key = ? AND raw = 1",
                        (key,)).fetchone()
    return None if found is None else Row(found[0], found[1], found[2], float(found[3] or 0.0))


def access_time(con: sqlite3.Connection, key: str) -> float | None:
    """When the index last recorded a use of `key` (None: no such row)."""
    found = con.execute("SELECT access_time FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
    return None if found is None else float(found[0] or 0.0)


def present(con: sqlite3.Connection, keys: Sequence[str]) -> set[str]:
    """Which of `keys` have a row under a raw key (in batches within SQLite's bound on parameters)."""
    found: set[str] = set()
    for start in range(0, len(keys), 500):
        batch = keys[start:start + 500]
        marks = ",".join("?" * len(batch))
        found.update(k for (k,) in con.execute(f"SELECT key FROM Cache WHERE raw = 1 AND key IN ({marks})", batch))
    return found


def contains(con: sqlite3.Connection, key: str) -> bool:
    return con.execute("SELECT 1 FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone() is not None


def listing(con: sqlite3.Connection) -> list[tuple[Any, int, float, float]]:
    """(key, size, store time, access time) of every row under a raw key; no value is read."""
    return [(k, int(s or 0), float(st or 0), float(at or 0)) for k, s, st, at in
            con.execute("SELECT key, size, store_time, access_time FROM Cache WHERE raw = 1")]


def total_size(con: sqlite3.Connection) -> int:
    (total,) = con.execute("SELECT COALESCE(SUM(size), 0) FROM Cache").fetchone()
    return int(total)


def count_and_size(con: sqlite3.Connection) -> tuple[int, int]:
    """Rows under raw keys and their bytes."""
    count, size = con.execute("SELECT count(*), COALESCE(SUM(size), 0) FROM Cache WHERE raw = 1").fetchone()
    return int(count), int(size)


def value_filenames(con: sqlite3.Connection) -> list[str]:
    return [str(f) for (f,) in con.execute("SELECT filename FROM Cache WHERE filename IS NOT NULL")]


def raw_rows(con: sqlite3.Connection) -> Iterator[tuple[Any, int, Any]]:
    """(key, mode, inline value) of every row under a raw key, row by row (a damaged index yields
    the rows before its damage, then raises)."""
    yield from con.execute("SELECT key, mode, value FROM Cache WHERE raw = 1")


def inline_values(con: sqlite3.Connection) -> list[tuple[Any, Any, float, float]]:
    """(key, value, store time, access time) of the values kept inside the index."""
    return con.execute("SELECT key, value, store_time, access_time FROM Cache WHERE raw = 1 AND mode = ?"
                       " AND value IS NOT NULL", (MODE_RAW,)).fetchall()


# Writes (inside `writing`) ------------------------------------------------------------------------
def set_times(con: sqlite3.Connection, key: str, stored: float, used: float) -> None:
    con.execute("UPDATE Cache SET store_time = ?, access_time = ? WHERE key = ? AND raw = 1", (stored, used, key))


def insert_value_file(con: sqlite3.Connection, key: str, created: float, used: float, size: int,
                      filename: str) -> None:
    """A row for a value file already in place (a rebuilt index); diskcache's triggers count it."""
    con.execute(_INSERT, (key, created, used, size, MODE_BINARY, filename, None))


def insert_inline(con: sqlite3.Connection, key: str, when: float, value: bytes) -> None:
    """A row keeping `value` inside the index (salvaged from a damaged one; the writer moves it to a file)."""
    con.execute(_INSERT, (key, when, when, len(value), MODE_RAW, None, value))


_INSERT = ("INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
           " filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)")
