"""The persisted counters' own table (`kernel_cache.telemetry.counters`: stats/counters.db): flushes
from many processes add up, the table is read without writing, and no other file under stats/ (a
diskcache index a cache once held there) is ever read."""

from __future__ import annotations

import os
import sqlite3

import pytest
from conftest import run_python

from kernel_cache import Config, Store
from kernel_cache.telemetry import counters
from kernel_cache.telemetry.counters import COUNTERS_DB
from kernel_cache.telemetry.stats import STATS_DIR


def test_flushes_add_up_and_missing_counters_start_at_zero(tmp_path):
    counters.add(tmp_path, {"hits.disk": 2, "misses": 1}, 1.0)
    counters.add(tmp_path, {"hits.disk": 3, "entry_hits.abc": 1}, 1.0)
    assert counters.read(tmp_path, 1.0, ("hits.disk", "misses", "entry_hits.abc", "compiles")) == \
        {"hits.disk": 5, "misses": 1, "entry_hits.abc": 1}
    counters.delete(tmp_path, ("misses",), 1.0)
    assert "misses" not in counters.read(tmp_path, 1.0)


def test_nothing_is_written_where_nothing_was_counted(tmp_path):
    assert counters.read(tmp_path, 1.0) == {}
    Store(Config(dir=tmp_path / "cache")).close()
    assert (tmp_path / "cache" / STATS_DIR).is_dir() and not (tmp_path / "cache" / STATS_DIR / COUNTERS_DB).exists()


def test_a_link_planted_after_the_level_was_checked_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    os.symlink(victim, tmp_path / "stats")
    with pytest.raises(OSError, match="not a directory"):
        counters.add(tmp_path / "stats", {"misses": 1}, 1.0)
    (tmp_path / "real").mkdir()
    os.symlink(victim / "planted.db", tmp_path / "real" / COUNTERS_DB)
    with pytest.raises(OSError, match="not a regular file"):
        counters.add(tmp_path / "real", {"misses": 1}, 1.0)
    assert list(victim.iterdir()) == []


def test_processes_flushing_at_once_lose_no_count(tmp_path):
    code = f"""
from pathlib import Path
from kernel_cache.telemetry import counters
for _ in range(25):
    counters.add(Path({str(tmp_path)!r}), {{"hits.disk": 1}}, 10.0)
"""
    procs = [__import__("subprocess").Popen([__import__("sys").executable, "-c", code], env=os.environ | {
        "PYTHONPATH": os.pathsep.join(__import__("sys").path)}) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert counters.read(tmp_path, 1.0)["hits.disk"] == 100


def test_a_diskcache_counters_index_beside_the_table_is_never_read(tmp_path):
    old = tmp_path / "cache.db"  # where diskcache kept counters, with its table's shape
    with sqlite3.connect(old) as con:
        con.execute("CREATE TABLE Cache (key BLOB, raw INTEGER, value BLOB)")
        con.executemany("INSERT INTO Cache VALUES (?, 1, ?)", [("hits.disk", 7), ("compile_us", 1500)])
    con.close()
    before = old.read_bytes()
    counters.add(tmp_path, {"hits.disk": 1}, 1.0)
    assert counters.read(tmp_path, 1.0) == {"hits.disk": 1}
    assert old.read_bytes() == before


def test_a_read_only_look_reads_without_writing(tmp_path):
    cache = tmp_path / "cache"
    store = Store(Config(dir=cache))
    store.stats.compiled(0.5)
    store.close()
    stats_dir = cache / STATS_DIR
    db = stats_dir / COUNTERS_DB  # (a WAL reader may make its -shm and -wal files, as SQLite does)
    before = (db.stat().st_mtime_ns, db.read_bytes())
    store = Store(Config(dir=cache), read_only=True)
    assert store.stats.totals()["compiles"] == 1
    store.stats.compiled(0.5)  # counted for this process, never written
    store.close()
    assert (db.stat().st_mtime_ns, db.read_bytes()) == before


def test_a_symlinked_counters_file_refuses_the_cache(tmp_path):
    cache = tmp_path / "cache"
    store = Store(Config(dir=cache))
    store.stats.compiled(0.1)
    store.close()
    target = tmp_path / "elsewhere.db"
    os.replace(cache / STATS_DIR / COUNTERS_DB, target)
    os.symlink(target, cache / STATS_DIR / COUNTERS_DB)
    code = f"import kernel_cache; s = kernel_cache.Store(kernel_cache.Config(dir={str(cache)!r})); print(s.disk)"
    assert run_python(code).stdout.strip().splitlines()[-1] == "None"
