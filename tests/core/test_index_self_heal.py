"""A damaged local index heals itself: the next process that opens the cache for
writing rebuilds the index from the entry files under the index lock, says so in one warning and
compiles nothing that is stored. Several processes starting at once on the damaged directory rebuild
it once: the others wait for the lock (a bounded wait), then use the rebuilt index, or read the entry
files meanwhile. The damaged index is kept aside, as `cachectl verify --repair` keeps it.

Synthetic entries through kernel_cache.Store: no kernel is compiled here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from conftest import ROOT, child_env
from disk_neighbour import store_opened_while_the_index_is_held

from kernel_cache import Config, Entry, Store
from kernel_cache.levels.disk.level import DiskLevel
from kernel_cache.levels.disk.repair import ValueFilesLevel
from kernel_cache.telemetry.warnings_once import KernelCacheWarning

KEYS = [f"{i:032x}" for i in range(1, 25)]

# A process of the job: opens the store, asks for every stored kernel (a builder counts what it would
# compile), reports what it compiled, where the hits came from and the warnings it gave.
CHILD = textwrap.dedent("""
    import json, os, sys, time, warnings
    from pathlib import Path
    from kernel_cache import Config, Store
    from kernel_cache.levels.disk import repair as disk_repair

    directory, keys, out = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
    go = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    if os.environ.get("SLOW_REBUILD"):  # the rebuild takes a while: a neighbour surely meets it
        real = disk_repair._rebuild
        def slow(*args, **kwargs):
            time.sleep(float(os.environ["SLOW_REBUILD"]))
            return real(*args, **kwargs)
        disk_repair._rebuild = slow
    while go is not None and not go.exists():
        time.sleep(0.005)
    compiled = []
    def builder(key):
        def build():
            compiled.append(key)
            return {"name": "k"}, {"cubin": b"rebuilt"}, 0.1
        return build
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = Store(Config(dir=directory))
        for key in keys:
            store.get_or_create(key, builder(key))
    report = {"compiled": compiled, "level": type(store.disk).__name__, "healed": store.healed_index,
              "warnings": [str(w.message) for w in caught]}
    store.close()
    Path(out).write_text(json.dumps(report))
""")


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # each test's warnings said afresh (conftest)


def _entry(key: str, size: int) -> Entry:
    return Entry(key=key, meta={"name": "kern", "compile_seconds": 0.5, "created": time.time()},
                 blobs={"cubin": os.urandom(size)})


def _filled(tmp_path: Path) -> Path:
    """A cache holding KEYS, small and large entries alike (each one a value file), its index closed."""
    cache = tmp_path / "cache"
    store = Store(Config(dir=cache))
    for n, key in enumerate(KEYS):
        store.put(_entry(key, 100 if n % 2 else 70_000))
    store.close()
    return cache


def _damage(cache: Path, how: str) -> None:
    entries = cache / "entries"
    for name in ("index.db-wal", "index.db-shm"):
        (entries / name).unlink(missing_ok=True)
    db = entries / "index.db"
    if how == "truncated":
        db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    elif how == "emptied":
        db.write_bytes(b"")
    elif how == "overwritten":
        db.write_bytes(b"not a database" * 300)
    elif how == "removed":
        db.unlink()


def _aside(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "entries").glob("index.db.damaged-*"))


def _child(cache: Path, tmp_path: Path, name: str) -> dict:
    """Run CHILD in a new process on `cache`; its report."""
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(cache), json.dumps(KEYS), str(out)], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("how", ["truncated", "emptied", "overwritten", "removed"])
def test_the_next_process_rebuilds_the_index_and_compiles_nothing_stored(tmp_path, how):
    cache = _filled(tmp_path)
    _damage(cache, how)

    first = _child(cache, tmp_path, "first")
    assert first["compiled"] == [] and first["level"] == "DiskLevel"
    (warning,) = first["warnings"]  # one warning, saying what happened and where the damaged index is
    assert f"rebuilt it from its {len(KEYS)} entry files ({len(KEYS)} entries re-indexed" in warning
    assert "0 lost" in warning and "caching in memory only" not in warning
    assert first["healed"]["recovered"] == len(KEYS)
    if how == "removed":
        assert _aside(cache) == [] and first["healed"]["moved_aside"] is None
    else:
        assert _aside(cache) == [first["healed"]["moved_aside"]] and "kept as entries/index.db.damaged-" in warning
    assert not [p for p in (cache / "entries").iterdir() if p.name.startswith(".rebuild-")]

    again = _child(cache, tmp_path, "again")  # healed for good: no warning, no rebuild, nothing compiled
    assert again["compiled"] == [] and again["warnings"] == [] and again["healed"] is None
    store = Store(Config(dir=cache))
    assert [store.get(k)[1] for k in KEYS] == ["disk"] * len(KEYS)
    assert store.disk.integrity_problem() is None
    store.close()


def test_processes_starting_at_once_rebuild_once(tmp_path):
    cache = _filled(tmp_path)
    _damage(cache, "truncated")
    go = tmp_path / "go"
    procs, outs = [], []
    for n in range(3):
        outs.append(tmp_path / f"p{n}.json")
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(cache), json.dumps(KEYS), str(outs[-1]), str(go)],
                                      cwd=ROOT, env=child_env(SLOW_REBUILD="0.5"), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    time.sleep(1.0)  # every child imported and waiting
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    reports = [json.loads(out.read_text()) for out in outs]
    assert [r["compiled"] for r in reports] == [[], [], []]
    assert sorted(r["healed"] is not None for r in reports) == [False, False, True]  # one rebuilt
    assert len(_aside(cache)) == 1  # one damaged index kept, not a rebuilt one moved aside by a second rebuild
    warned = [w for r in reports for w in r["warnings"]]
    assert len(warned) == 1 and "rebuilt it from its" in warned[0]  # the others waited, then used it
    assert [r["level"] for r in reports] == ["DiskLevel"] * 3


def test_a_neighbour_rebuilding_for_long_leaves_the_entry_files_served(tmp_path):
    """A process that waits longer than the index timeout for the neighbour's rebuild reads the entry
    files meanwhile: it compiles nothing stored; what it compiles stays in memory."""
    cache = _filled(tmp_path)
    _damage(cache, "truncated")
    new_key = "f" * 32
    with store_opened_while_the_index_is_held(cache) as (store, caught):  # the neighbour, rebuilding
        assert isinstance(store.disk, ValueFilesLevel) and not store.disk.writable
        (warning,) = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
        assert "another process is rebuilding it" in warning and "serving its entry files" in warning
        built = []
        for key in [*KEYS, new_key]:
            store.get_or_create(key, lambda k=key: built.append(k) or ({"name": "k"}, {"cubin": b"x"}, 0.1))
        assert built == [new_key]  # the stored ones came from the files
        assert store.get(KEYS[0])[1] == "memory" and new_key not in store.disk
        store.close()
    assert _aside(cache) == []  # it rebuilt nothing: the lock's holder does
    with warnings.catch_warnings(record=True) as caught:  # the next process, the lock free, rebuilds it
        warnings.simplefilter("always")
        healed = Store(Config(dir=cache))
    assert ["rebuilt it from its" in str(w.message) for w in caught] == [True]
    assert isinstance(healed.disk, DiskLevel) and healed.healed_index is not None
    assert all(healed.get(k)[1] == "disk" for k in KEYS)
    healed.close()


def test_a_read_only_view_leaves_the_damage_to_a_writer(tmp_path):
    """An operator's read-only look (cachectl list) changes nothing: the entry files are read."""
    cache = _filled(tmp_path)
    _damage(cache, "truncated")
    damaged = (cache / "entries" / "index.db").read_bytes()

    def names() -> list[str]:  # (SQLite's reader may leave the index's journal files)
        return sorted(p.name for p in (cache / "entries").iterdir() if not p.name.endswith(("-wal", "-shm")))

    before = names()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        viewer = Store(Config(dir=cache), read_only=True)
    assert viewer.disk is None and viewer.healed_index is None
    viewer.close()
    assert names() == before and (cache / "entries" / "index.db").read_bytes() == damaged


def test_a_new_cache_is_no_damage(tmp_path):
    """No index and no entry file is a new cache: its index is created, nothing is said."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = Store(Config(dir=tmp_path / "new"))
    assert isinstance(store.disk, DiskLevel) and store.healed_index is None and caught == []
    store.put(_entry(KEYS[0], 100))
    store.close()
    assert _aside(tmp_path / "new") == []


def test_a_healthy_index_a_reader_cannot_read_is_not_rebuilt(tmp_path, monkeypatch):
    """A reader that cannot use the index's journal reads the file without it (a healthy index before
    its first checkpoint can look empty, one mid-checkpoint malformed): a writing process confirms the
    damage with a writer's connection before it rebuilds anything."""
    import sqlite3

    from kernel_cache.levels.disk import level as disk

    cache = _filled(tmp_path)
    seen = []

    def blind_reader(db, timeout):  # sees a file without the table
        seen.append(db)
        return sqlite3.connect(":memory:", check_same_thread=False)

    monkeypatch.setattr(disk, "open_read_only", blind_reader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = Store(Config(dir=cache))
    assert seen and caught == [] and store.healed_index is None and isinstance(store.disk, DiskLevel)
    monkeypatch.undo()
    assert [store.get(k)[1] for k in KEYS] == ["disk"] * len(KEYS) and _aside(cache) == []
    store.close()


def test_a_writing_cachectl_command_says_it_rebuilt_the_index(tmp_path):
    """prune, clear, import and prewarm open the store for writing, which heals: the operator is told."""
    cache = _filled(tmp_path)
    _damage(cache, "truncated")
    proc = subprocess.run([sys.executable, "-m", "kernel_cache", "prune", "--dir", str(cache), "--max-size", "1G"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "local index was damaged" in line]
    assert len(said) == 1 and "rebuilt it from its" in said[0] and "kept as entries/" in said[0], proc.stderr
    assert _aside(cache)
