"""The counters that survive the process, in a table of our own: `stats/counters.db`, one SQLite
table `counters (name, value)`.

A flush adds its deltas in one write transaction (an upsert per counter: atomic across processes);
readers open the file read-only (immutable on a read-only mount); every wait is bounded by the
caller's timeout. A cache an older kernel-cache wrote kept its counters in a diskcache index under
`stats/`: the first process that creates the table imports them through diskcache's public API
(`disk_old_format.counters`), in the transaction that creates it, so two processes never import
them twice; that index is then left as it was.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kernel_cache.lazy import later
from kernel_cache.levels.disk.index import COUNTERS_DB, OLD_INDEX
from kernel_cache.levels.disk.sql import open_read_only, writing

if TYPE_CHECKING:
    from kernel_cache.levels.disk import old_format as disk_old_format
else:
    disk_old_format = later("kernel_cache.levels.disk.old_format")  # only when the table is created

_IMPORTED = "<imported from the diskcache index>"  # a row saying the older index's counters came in


def add(stats_dir: Path, amounts: Mapping[str, int], timeout: float) -> None:
    """Add each amount to its counter (a missing one starting at 0), in one write transaction; the
    table is created (and an older index's counters imported) by the first write."""
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
    with contextlib.closing(open_read_only(db, timeout)) as con:
        if names is None:
            rows = con.execute("SELECT name, value FROM counters").fetchall()
        else:
            wanted = list(names)
            rows = [row for name in wanted
                    for row in con.execute("SELECT name, value FROM counters WHERE name = ?", (name,))]
    return {name: value for name, value in rows if isinstance(name, str) and isinstance(value, int)}


@contextlib.contextmanager
def _writing(stats_dir: Path, timeout: float) -> Iterator[sqlite3.Connection]:
    """A write transaction on the table, made if need be. The directory (made by the disk level
    through its checked tree) and the file must be what they were when the level was checked: a
    link planted since is refused (OSError), never followed."""
    db = stats_dir / COUNTERS_DB
    if not stat.S_ISDIR(os.lstat(stats_dir).st_mode):
        raise OSError(f"{stats_dir} is not a directory")
    found = _lstat(db)
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise OSError(f"{db} is not a regular file")
    # synchronous NORMAL: counters are best effort, no fsync per flush
    with writing(db, timeout, synchronous=1, create=True) as con:
        if found is None or con.execute("SELECT 1 FROM sqlite_master WHERE name = 'counters'").fetchone() is None:
            _create(con, stats_dir, timeout)
        yield con


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _create(con: sqlite3.Connection, stats_dir: Path, timeout: float) -> None:
    """The table, inside the caller's transaction, with an older diskcache index's counters imported
    once (the marker row says they came in; a neighbour that created the table first already did)."""
    con.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID")
    if con.execute("SELECT 1 FROM counters WHERE name = ?", (_IMPORTED,)).fetchone() is not None:
        return
    older = disk_old_format.counters(stats_dir, timeout) if (stats_dir / OLD_INDEX).is_file() else {}
    con.executemany("INSERT INTO counters (name, value) VALUES (?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value", [*older.items(), (_IMPORTED, 1)])
