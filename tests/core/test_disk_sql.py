"""kernel_cache/levels/disk/sql.py is the one module that reads and writes diskcache's tables itself, written
against one diskcache version: a different version fails here until someone checks its
statements against that version's schema and moves the pin."""

from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path

import diskcache
from conftest import ROOT

from kernel_cache import Entry
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import RawOnlyDisk, ValueFile
from kernel_cache.levels.disk.level import DiskLevel, index_settings

KEYS = [f"{i:032x}" for i in range(1, 4)]


def test_diskcache_is_the_version_disk_sql_was_written_against():
    assert diskcache.__version__ == disk_sql.WRITTEN_AGAINST, (
        f"diskcache {diskcache.__version__} is installed; kernel_cache/levels/disk/sql.py reads and writes the tables of "
        f"diskcache {disk_sql.WRITTEN_AGAINST}: check its statements against the new schema, then move WRITTEN_AGAINST")


def test_the_index_has_the_columns_disk_sql_uses(tmp_path):
    diskcache.Cache(str(tmp_path), **index_settings(1 << 20)).close()
    with sqlite3.connect(tmp_path / "cache.db") as con:
        columns = [row[1] for row in con.execute("PRAGMA table_info(Cache)")]
        triggers = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert tuple(columns) == disk_sql.COLUMNS
    # a row disk_sql inserts is counted by diskcache's own triggers (its size bound sees it)
    assert {"Settings_count_insert", "Settings_size_insert"} <= triggers


def test_no_other_module_touches_diskcaches_tables_or_its_private_connection():
    statement = re.compile(r"\b(_sql\b|(SELECT|UPDATE|DELETE FROM|INSERT INTO)\b.*\b(Cache|Settings)\b|PRAGMA )")
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "kernel_cache").rglob("*.py"))
             if path.relative_to(ROOT).as_posix() not in ("kernel_cache/levels/disk/sql.py", OUR_TABLE)
             for n, line in enumerate(path.read_text().splitlines(), 1) if statement.search(line)]
    assert found == []
    ours = (ROOT / OUR_TABLE).read_text()  # the counters' own table, beside diskcache's: it names neither of diskcache's
    assert not re.search(r"\b(FROM|INTO|UPDATE|TABLE)\s+(Cache|Settings)\b", ours)


OUR_TABLE = "kernel_cache/telemetry/counters.py"


def _entry(key: str) -> Entry:
    return Entry(key=key, meta={"name": "k", "created": time.time()}, blobs={"cubin": b"c" * 2000})


def test_a_value_file_is_fetched_as_its_name_never_its_bytes(tmp_path):
    with diskcache.Cache(str(tmp_path), **index_settings(1 << 20)) as cache:
        cache.set(KEYS[0], b"v" * 100)
        found = cache.get(KEYS[0])
    assert isinstance(found, ValueFile) and (tmp_path / found.filename).read_bytes() == b"v" * 100
    assert issubclass(index_settings(1)["disk"], RawOnlyDisk)


def test_deferred_uses_are_recorded_oldest_first_without_reading_a_value_file(tmp_path, monkeypatch):
    level = DiskLevel(tmp_path / "c", 1 << 20)
    for key in KEYS:
        level.put(_entry(key))
    with disk_sql.writing(tmp_path / "c" / "entries" / "cache.db", 5.0) as con:
        for key in KEYS:
            disk_sql.set_times(con, key, 1000.0, 1000.0)
    level.touch([KEYS[2]])
    level.touch([KEYS[0]])
    monkeypatch.setattr(level.tree, "read", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read")))
    level.flush_touches()
    used = {r["key"]: r["last_used"] for r in level.listing()}
    assert used[KEYS[1]] == 1000.0 and 1000.0 < used[KEYS[2]] < used[KEYS[0]]
    assert {r["key"]: r["created"] for r in level.listing()}[KEYS[0]] == 1000.0  # a use keeps its creation time
    level.close()


def test_a_rebuilt_index_keeps_the_times_of_its_value_files(tmp_path):
    from kernel_cache.levels.disk.repair import rebuild_index

    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    (filename,) = disk_sql.value_filenames(level._reader())
    level.close()
    value = directory / "entries" / filename
    os.utime(value, (2000.0, 2000.0))
    (directory / "entries" / "cache.db").write_bytes(b"not a database" * 100)
    for name in ("cache.db-wal", "cache.db-shm"):
        Path(directory / "entries" / name).unlink(missing_ok=True)
    report = rebuild_index(directory)
    assert report["recovered"] == 1
    level = DiskLevel(directory, 1 << 20)
    (row,) = level.listing()
    assert row["key"] == KEYS[0] and row["last_used"] == 2000.0 and row["created"] > 1e9
    found = level.get(KEYS[0])
    assert found is not None and found.blobs == _entry(KEYS[0]).blobs
    level.close()
