"""The counters that survive the process, in a table of our own: `stats/counters.db`, one SQLite
table `counters (name, value)`. A flush adds its deltas in one write transaction (an upsert per
counter: atomic across processes, which separate files could not be without a lock); readers open
the file read-only (immutable on a read-only mount); every wait is bounded by the caller's timeout.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from urllib.parse import quote

COUNTERS_DB = "counters.db"


def add(stats_dir: Path, amounts: Mapping[str, int], timeout: float) -> None:
    """Add each amount to its counter (a missing one starting at 0), in one write transaction."""
    with _writing(stats_dir, timeout) as con:
        con.executemany("INSERT INTO counters (name, value) VALUES (?, ?)"
                        " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value", amounts.items())


def delete(stats_dir: Path, names: Iterable[str], timeout: float) -> None:
    with _writing(stats_dir, timeout) as con:
        con.executemany("DELETE FROM counters WHERE name = ?", ((name,) for name in names))


def read(stats_dir: Path, timeout: float, names: Iterable[str] | None = None) -> dict[str, int]:
    """The persisted counters (those named, or all); empty where no process has written any."""
    db = stats_dir / COUNTERS_DB
    if not db.is_file():
        return {}
    with contextlib.closing(_open_read_only(db, timeout)) as con:
        if names is None:
            rows = con.execute("SELECT name, value FROM counters").fetchall()
        else:
            rows = [row for name in list(names)
                    for row in con.execute("SELECT name, value FROM counters WHERE name = ?", (name,))]
    return {name: value for name, value in rows if isinstance(name, str) and isinstance(value, int)}


def _open_read_only(db: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection; on a read-only mount, where SQLite cannot make the WAL's shared memory
    file, an `immutable` one (nobody can be writing there anyway)."""
    con = sqlite3.connect(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=timeout, isolation_level=None)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return con
    except sqlite3.OperationalError as exc:
        con.close()
        if "locked" in str(exc):
            raise
    return sqlite3.connect(f"file:{quote(str(db))}?immutable=1", uri=True, timeout=timeout, isolation_level=None)


@contextlib.contextmanager
def _writing(stats_dir: Path, timeout: float) -> Iterator[sqlite3.Connection]:
    """A write transaction on the table, made if need be. A link planted at the directory or the file
    since the level checked them is refused (OSError), never followed."""
    db = stats_dir / COUNTERS_DB
    if not stat.S_ISDIR(os.lstat(stats_dir).st_mode):
        raise OSError(f"{stats_dir} is not a directory")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(db).st_mode):
            raise OSError(f"{db} is not a regular file")
    con = sqlite3.connect(f"file:{quote(str(db))}?mode=rwc", uri=True, timeout=timeout, isolation_level=None)
    try:
        _into_wal(con, timeout)
        con.execute("PRAGMA synchronous = 1")  # NORMAL: counters are best effort, no fsync per flush
        con.execute("BEGIN IMMEDIATE")
        try:
            con.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)"
                        " WITHOUT ROWID")
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    finally:
        con.close()


def _into_wal(con: sqlite3.Connection, timeout: float) -> None:
    """Write-ahead-log mode, so readers never wait for a writer. Neighbours creating the file at once
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
