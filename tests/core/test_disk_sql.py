"""The local level's own index (kernel_cache/levels/disk/sql.py, entries/index.db): its schema, its
least-recently-used eviction, recorded uses and rebuilt times; value files read through safefs (a
vanished one a miss, a planted link or FIFO refused); no SQL against diskcache's tables anywhere, and
diskcache imported by the old-format upgrade alone."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
import warnings
from pathlib import Path

import pytest
from conftest import ROOT

from kernel_cache import Config, CorruptEntry, Entry, Store
from kernel_cache.errors import LevelUntrusted
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import ENTRIES_DIR, INDEX
from kernel_cache.levels.disk.level import DiskLevel
from kernel_cache.telemetry.warnings_once import KernelCacheWarning

KEYS = [f"{i:032x}" for i in range(1, 7)]


def _entry(key: str, size: int = 2000) -> Entry:
    return Entry(key=key, meta={"name": "k", "created": time.time()}, blobs={"cubin": b"c" * size})


def _rows(directory: Path) -> dict[str, tuple]:
    """key -> (filename, size, stored, used), read with a plain SQLite connection."""
    with sqlite3.connect(directory / ENTRIES_DIR / INDEX) as con:
        return {k: rest for k, *rest in con.execute("SELECT key, filename, size, stored, used FROM entries")}


def _age(directory: Path, used: dict[str, float]) -> None:
    with sqlite3.connect(directory / ENTRIES_DIR / INDEX) as con:
        con.executemany("UPDATE entries SET used = ? WHERE key = ?", [(t, k) for k, t in used.items()])


def test_nothing_runs_sql_on_diskcaches_tables_and_one_module_imports_it():
    statement = re.compile(r"\b(FROM|INTO|UPDATE|TABLE)\s+(Cache|Settings)\b")
    sources = sorted(p for d in ("kernel_cache", "cachectl") for p in (ROOT / d).rglob("*.py"))
    assert [f"{p.relative_to(ROOT)}:{n}" for p in sources for n, line in enumerate(p.read_text().splitlines(), 1)
            if statement.search(line)] == []
    importers = [p.relative_to(ROOT).as_posix() for p in sources
                 if re.search(r"^\s*(import|from)\s+diskcache\b", p.read_text(), re.M)]
    assert importers == ["kernel_cache/levels/disk/old_format.py"]


def test_the_index_is_ours_in_write_ahead_log_mode(tmp_path):
    level = DiskLevel(tmp_path / "c", 1 << 20)
    level.put(_entry(KEYS[0]))
    level.close()
    db = tmp_path / "c" / ENTRIES_DIR / INDEX
    with sqlite3.connect(db) as con:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        settings = dict(con.execute("SELECT name, value FROM settings"))
        (mode,) = con.execute("PRAGMA journal_mode").fetchone()
    assert tables == {"entries", "settings"} and mode == "wal"
    assert settings == {"schema": disk_sql.SCHEMA_VERSION, "max_bytes": 1 << 20}
    (filename, size, stored, used) = _rows(tmp_path / "c")[KEYS[0]]
    assert (tmp_path / "c" / ENTRIES_DIR / filename).stat().st_size == size and stored == used
    assert not (tmp_path / "c" / ENTRIES_DIR / "cache.db").exists()


def test_a_write_past_the_bound_evicts_the_least_recently_used(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 30)
    for key in KEYS[:4]:
        level.put(_entry(key))
    size = _rows(directory)[KEYS[0]][1]
    _age(directory, {KEYS[0]: 4000.0, KEYS[1]: 1000.0, KEYS[2]: 3000.0, KEYS[3]: 2000.0})
    files = {k: directory / ENTRIES_DIR / row[0] for k, row in _rows(directory).items()}
    level.close()

    level = DiskLevel(directory, 4 * size + size // 2)  # room for four: the fifth write evicts the least recently used
    level.put(_entry(KEYS[4]))
    assert set(_rows(directory)) == {KEYS[0], KEYS[2], KEYS[3], KEYS[4]} and not files[KEYS[1]].exists()
    level.set_max_bytes(3 * size + size // 2)  # room for three: the next write evicts the two least recently used
    level.put(_entry(KEYS[5]))
    assert set(_rows(directory)) == {KEYS[0], KEYS[4], KEYS[5]}
    assert not files[KEYS[2]].exists() and not files[KEYS[3]].exists() and files[KEYS[0]].exists()
    assert sum(row[1] for row in _rows(directory).values()) <= 3 * size + size // 2
    assert level.get(KEYS[1]) is None and level.get(KEYS[0]) is not None
    level.close()


def test_a_write_evicts_a_bounded_number_and_cull_the_rest(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 30)
    keys = [f"{i:032x}" for i in range(100, 100 + disk_sql.CULL_LIMIT + 5)]
    for key in keys:
        level.put(_entry(key, 100))
    level.close()
    level = DiskLevel(directory, 0)
    level.put(_entry(KEYS[0], 100))
    assert len(_rows(directory)) == len(keys) + 1 - disk_sql.CULL_LIMIT  # at most CULL_LIMIT per entry written
    assert level.cull() == len(keys) + 1 - disk_sql.CULL_LIMIT
    assert _rows(directory) == {} and not list((directory / ENTRIES_DIR).rglob("*.val"))
    level.close()


def test_deferred_uses_are_recorded_with_their_times_without_reading_a_value_file(tmp_path, monkeypatch):
    level = DiskLevel(tmp_path / "c", 1 << 20)
    for key in KEYS[:3]:
        level.put(_entry(key))
    with sqlite3.connect(tmp_path / "c" / ENTRIES_DIR / INDEX) as con:
        con.execute("UPDATE entries SET stored = 1000, used = 1000")
    level.touch([KEYS[2]])
    time.sleep(0.01)
    level.touch([KEYS[0]])
    monkeypatch.setattr(level.tree, "read", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read")))
    level.flush_touches()
    used = {r["key"]: r["last_used"] for r in level.listing()}
    assert used[KEYS[1]] == 1000.0 and 1000.0 < used[KEYS[2]] < used[KEYS[0]]
    assert {r["key"]: r["created"] for r in level.listing()}[KEYS[0]] == 1000.0  # a use keeps its creation time
    level.close()


def test_a_hit_records_its_use_at_most_once_a_minute(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    _age(directory, {KEYS[0]: time.time() - 30})
    recent = _rows(directory)[KEYS[0]][3]
    assert level.get(KEYS[0]) is not None and _rows(directory)[KEYS[0]][3] == recent
    _age(directory, {KEYS[0]: 1000.0})
    assert level.get(KEYS[0]) is not None and _rows(directory)[KEYS[0]][3] > time.time() - 60
    level.close()


def test_a_value_file_removed_under_a_reader_is_a_miss_not_corruption(tmp_path, monkeypatch):
    """A neighbour evicts (row, then file) between this reader's SELECT and its read of the file."""
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    level.close()
    reader = DiskLevel(directory, 1 << 20, read_only=True)
    neighbour = DiskLevel(directory, 0)  # a bound of nothing: its cull evicts every entry
    real_lookup = disk_sql.lookup

    def lookup_then_evicted(con, key):
        found = real_lookup(con, key)
        assert neighbour.cull() == 1
        return found

    monkeypatch.setattr(disk_sql, "lookup", lookup_then_evicted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert found_nothing(reader, KEYS[0])  # a miss: no CorruptEntry, nothing reported
    monkeypatch.undo()
    assert KEYS[0] not in reader and reader.listing() == []
    reader.close()
    neighbour.close()


def found_nothing(level: DiskLevel, key: str) -> bool:
    return level.get(key) is None


def test_a_planted_link_or_fifo_as_a_value_file_is_refused_and_dropped(tmp_path):
    directory = tmp_path / "c"
    victim = tmp_path / "victim"
    victim.write_bytes(b"the operator's file")
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    level.put(_entry(KEYS[1]))
    rows = _rows(directory)
    link, fifo = (directory / ENTRIES_DIR / rows[k][0] for k in KEYS[:2])
    link.unlink()
    os.symlink(victim, link)
    fifo.unlink()
    os.mkfifo(fifo)
    for key in KEYS[:2]:
        with pytest.raises(CorruptEntry, match="value file refused"):
            level.get(key)  # (a FIFO never blocks the reader)
    assert set(_rows(directory)) == set() and not os.path.lexists(link) and not os.path.lexists(fifo)
    assert victim.read_bytes() == b"the operator's file"
    level.close()


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_planted_link_or_fifo_as_the_index_refuses_the_level(tmp_path, kind):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    level.close()
    db = directory / ENTRIES_DIR / INDEX
    elsewhere = tmp_path / "elsewhere.db"
    os.replace(db, elsewhere)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    if kind == "symlink":
        os.symlink(elsewhere, db)
    else:
        os.mkfifo(db)
    result: list[object] = []

    def open_it() -> None:
        try:
            result.append(Store(Config(dir=directory)))
        except Exception as exc:  # (the store degrades to memory rather than raising)
            result.append(exc)

    opener = threading.Thread(target=open_it, daemon=True)
    with pytest.warns(KernelCacheWarning, match="is not a regular file"):
        opener.start()
        opener.join(30)
    assert not opener.is_alive(), "opening blocked on the planted index"
    (store,) = result
    assert isinstance(store, Store) and store.disk is None and isinstance(store.unavailable["disk"], LevelUntrusted)
    assert "is not a regular file" in str(store.unavailable["disk"])
    store.close()
    with pytest.raises(LevelUntrusted):
        DiskLevel(directory, 1 << 20, read_only=True)


def test_a_rebuilt_index_keeps_the_times_of_its_value_files(tmp_path):
    from kernel_cache.levels.disk.repair import rebuild_index

    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    (filename, *_) = _rows(directory)[KEYS[0]]
    level.close()
    value = directory / ENTRIES_DIR / filename
    os.utime(value, (2000.0, 2000.0))
    (directory / ENTRIES_DIR / INDEX).write_bytes(b"not a database" * 100)
    for name in (f"{INDEX}-wal", f"{INDEX}-shm"):
        Path(directory / ENTRIES_DIR / name).unlink(missing_ok=True)
    report = rebuild_index(directory)
    assert report["recovered"] == 1
    level = DiskLevel(directory, 1 << 20)
    (row,) = level.listing()
    assert row["key"] == KEYS[0] and row["last_used"] == 2000.0 and row["created"] > 1e9
    found = level.get(KEYS[0])
    assert found is not None and found.blobs == _entry(KEYS[0]).blobs
    level.close()


def test_a_replaced_entrys_old_file_goes_once_the_new_row_is_in(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0], 100))
    old = directory / ENTRIES_DIR / _rows(directory)[KEYS[0]][0]
    level.put(_entry(KEYS[0], 200))
    new = directory / ENTRIES_DIR / _rows(directory)[KEYS[0]][0]
    assert not old.exists() and new.exists() and new != old
    assert len(level.get(KEYS[0]).blobs["cubin"]) == 200
    assert level.clear() == 1 and _rows(directory) == {} and not new.exists()
    level.close()
