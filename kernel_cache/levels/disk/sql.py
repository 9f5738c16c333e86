"""The local level's index, a SQLite file of our own: the one module that speaks SQL to it.

entries/index.db holds one row per value file and nothing else of ours or anyone's:

    entries (key TEXT PRIMARY KEY, filename TEXT NOT NULL, size INTEGER NOT NULL, stored REAL NOT NULL,
             used REAL NOT NULL)        filename: aa/bb/<28 hex>.val under entries/; times in epoch seconds
    entries_by_use ON entries (used)    the least recently used first, for eviction
    settings (name TEXT PRIMARY KEY, value)   'schema' (SCHEMA_VERSION), 'max_bytes' (the last writer's bound)

It is in write-ahead-log mode, so readers never wait for a writer. Each write below is one
`BEGIN IMMEDIATE` transaction on a connection of its own, waiting at most the caller's timeout for a
neighbour's; a write that adds entries also evicts the least recently used ones while the entries
hold more than the bound, at most CULL_LIMIT per entry added. The index is a cache of the value
files (each entry names its own key): `disk_rebuild` builds it again from them. Its readers are
connections of the level's own: read-only where the process has not written, else one that sees the
index as its writer does. The counters' table (`kernel_cache.telemetry.counters`) shares `writing`
and `open_read_only`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from urllib.parse import quote

from kernel_cache.trust.safefs import UnsafeFile

SCHEMA_VERSION = 1
CULL_LIMIT = 10  # entries evicted at most per entry a write adds (a bounded write: `cull` evicts the rest)
NORMAL = 1  # PRAGMA synchronous: a power cut may lose the last writes, never the index (WAL)
_DAMAGE_CODES = (11, 26)  # SQLITE_CORRUPT ("disk image is malformed"), SQLITE_NOTADB ("not a database")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, filename TEXT NOT NULL, size INTEGER NOT NULL,"
    " stored REAL NOT NULL, used REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS entries_by_use ON entries (used)",
)


# Connections ----------------------------------------------------------------------------------
def open_read_only(db: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection; on a read-only mount where SQLite cannot create the WAL's shared
    memory file, fall back to `immutable` (nobody can be writing there anyway)."""
    if not db.is_file():
        raise FileNotFoundError(f"no index at {db}")
    uri = f"file:{quote(str(db))}?mode=ro"
    con = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False, isolation_level=None)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return con
    except sqlite3.OperationalError as exc:
        con.close()
        if "locked" in str(exc):
            raise
    except BaseException:
        con.close()
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
    not there yet is made; it is (or is put) in write-ahead-log mode, so its readers never wait for a writer."""
    con = sqlite3.connect(f"file:{quote(str(db))}?mode={'rwc' if create else 'rw'}", uri=True, timeout=timeout,
                          check_same_thread=False, isolation_level=None)
    try:
        if create:
            _into_wal(con, timeout)
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


def _into_wal(con: sqlite3.Connection, timeout: float) -> None:
    """Put the database in write-ahead-log mode where it is not yet. Neighbours creating it at once
    meet here, and SQLite answers "locked" to all but one without waiting: asked again until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                con.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def checkpoint(con: sqlite3.Connection) -> None:
    """Everything in the write-ahead log written into the index file itself (before it is moved)."""
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")


# Damage -----------------------------------------------------------------------------------------
def probe(con: sqlite3.Connection) -> None:
    """Read the index's table once: raises what a damaged, empty or busy index raises."""
    con.execute("SELECT count(*) FROM entries").fetchone()


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


# The schema -------------------------------------------------------------------------------------
def create(con: sqlite3.Connection, max_bytes: int) -> None:
    """The tables where they are missing (inside the caller's transaction), the bound recorded."""
    for statement in _SCHEMA:
        con.execute(statement)
    con.execute("INSERT OR IGNORE INTO settings (name, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))
    con.execute("INSERT OR REPLACE INTO settings (name, value) VALUES ('max_bytes', ?)", (int(max_bytes),))


def open_index(db: Path, timeout: float, max_bytes: int) -> None:
    """Make the index where there is none, or check one a writer may write: one transaction (so a
    busy or unwritable index says so here). ValueError for an index of a schema we do not know;
    UnsafeFile for a link or a FIFO in its place (SQLite would follow the one and block on the other)."""
    try:
        st = os.lstat(db)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(str(db), "is not a regular file")
    with writing(db, timeout, NORMAL, create=True) as con:
        found = con.execute("SELECT value FROM settings WHERE name = 'schema'").fetchone() \
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'settings'").fetchone() else None
        if found is not None and found[0] != SCHEMA_VERSION:
            raise ValueError(f"the index has schema {found[0]!r}, this kernel-cache writes schema {SCHEMA_VERSION}")
        create(con, max_bytes)


# Reads ------------------------------------------------------------------------------------------
def lookup(con: sqlite3.Connection, key: str) -> tuple[str, float] | None:
    """(value file, last use) of `key`: the one statement of a lookup."""
    found = con.execute("SELECT filename, used FROM entries WHERE key = ?", (key,)).fetchone()
    return None if found is None else (found[0], float(found[1] or 0.0))


def used_time(con: sqlite3.Connection, key: str) -> float | None:
    """When the index last recorded a use of `key` (None: no such row)."""
    found = con.execute("SELECT used FROM entries WHERE key = ?", (key,)).fetchone()
    return None if found is None else float(found[0] or 0.0)


def present(con: sqlite3.Connection, keys: Sequence[str]) -> set[str]:
    """Which of `keys` have a row (in batches within SQLite's bound on parameters)."""
    found: set[str] = set()
    for start in range(0, len(keys), 500):
        batch = keys[start:start + 500]
        marks = ",".join("?" * len(batch))
        found.update(k for (k,) in con.execute(f"SELECT key FROM entries WHERE key IN ({marks})", batch))
    return found


def contains(con: sqlite3.Connection, key: str) -> bool:
    return con.execute("SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone() is not None


def listing(con: sqlite3.Connection) -> list[tuple[object, int, float, float]]:
    """(key, size, store time, last use) of every row; no value is read."""
    return [(k, int(s or 0), float(st or 0), float(at or 0)) for k, s, st, at in
            con.execute("SELECT key, size, stored, used FROM entries")]


def count_and_size(con: sqlite3.Connection) -> tuple[int, int]:
    """Rows and their bytes."""
    count, size = con.execute("SELECT count(*), COALESCE(SUM(size), 0) FROM entries").fetchone()
    return int(count), int(size)


def value_filenames(con: sqlite3.Connection) -> list[str]:
    return [str(f) for (f,) in con.execute("SELECT filename FROM entries")]


def keys(con: sqlite3.Connection) -> Iterator[object]:
    """Every row's key, row by row (a damaged index yields the rows before its damage, then raises)."""
    for (key,) in con.execute("SELECT key FROM entries"):
        yield key


# Writes, each its own transaction ---------------------------------------------------------------
Row = tuple[str, str, int, float, float]  # (key, filename, size, stored, used)


def insert(con: sqlite3.Connection, row: Row) -> str | None:
    """Add or replace a row (inside the caller's transaction); the value file it replaced, if any."""
    old = con.execute("SELECT filename FROM entries WHERE key = ?", (row[0],)).fetchone()
    con.execute("INSERT INTO entries (key, filename, size, stored, used) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (key) DO UPDATE SET filename = excluded.filename, size = excluded.size,"
                " stored = excluded.stored, used = excluded.used", row)
    return None if old is None or old[0] == row[1] else str(old[0])


def put(db: Path, timeout: float, rows: Sequence[Row], max_bytes: int) -> list[str]:
    """Index `rows` (their value files in place), then evict the least recently used while the
    entries hold more than `max_bytes` (at most CULL_LIMIT per row). Returns the value files no row
    names any more (replaced or evicted): the caller removes them once this has committed."""
    with writing(db, timeout, NORMAL) as con:
        unnamed = [old for row in rows if (old := insert(con, row)) is not None]
        unnamed += [filename for _, filename in _evict(con, max_bytes, CULL_LIMIT * len(rows))]
    return unnamed


def cull(db: Path, timeout: float, max_bytes: int) -> list[tuple[str, str]]:
    """Evict the least recently used until the entries fit in `max_bytes`: (key, value file) of each."""
    with writing(db, timeout, NORMAL) as con:
        return _evict(con, max_bytes, None)


def _evict(con: sqlite3.Connection, max_bytes: int, limit: int | None) -> list[tuple[str, str]]:
    (total,) = con.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()
    evicted: list[tuple[str, str]] = []
    if total <= max_bytes:
        return evicted
    for key, filename, size in con.execute("SELECT key, filename, size FROM entries ORDER BY used"
                                           + ("" if limit is None else f" LIMIT {int(limit)}")).fetchall():
        if total <= max_bytes:
            break
        evicted.append((key, filename))
        total -= int(size or 0)
    con.executemany("DELETE FROM entries WHERE key = ?", [(key,) for key, _ in evicted])
    return evicted


def touch(db: Path, timeout: float, uses: Iterable[tuple[str, float]]) -> None:
    """Record uses (key, when) for the LRU order, one transaction; a later recorded use stays."""
    with writing(db, timeout, NORMAL) as con:
        con.executemany("UPDATE entries SET used = ? WHERE key = ? AND used < ?", ((when, key, when) for key, when in uses))


def delete(db: Path, timeout: float, key: str, filename: str | None = None) -> bool:
    """Remove `key`'s row (only while it names `filename`, where given): whether one went."""
    with writing(db, timeout, NORMAL) as con:
        if filename is None:
            return con.execute("DELETE FROM entries WHERE key = ?", (key,)).rowcount > 0
        return con.execute("DELETE FROM entries WHERE key = ? AND filename = ?", (key, filename)).rowcount > 0


def clear(db: Path, timeout: float) -> int:
    """Remove every row; how many there were."""
    with writing(db, timeout, NORMAL) as con:
        return int(con.execute("DELETE FROM entries").rowcount)


def set_max_bytes(db: Path, timeout: float, max_bytes: int) -> None:
    with writing(db, timeout, NORMAL) as con:
        con.execute("INSERT OR REPLACE INTO settings (name, value) VALUES ('max_bytes', ?)", (int(max_bytes),))
