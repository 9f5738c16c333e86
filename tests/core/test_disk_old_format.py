"""A cache directory an older kernel-cache wrote (diskcache's index in entries/cache.db, small entries
kept inside it, larger ones in value files) is upgraded by the first process that opens it for
writing: our own index built from the value files, the inline entries moved to files, nothing lost,
cache.db removed; read through diskcache's public API alone, a pickled row never loaded. A process
that only reads finds it not indexed yet (misses) and changes nothing."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import diskcache
import pytest
from disk_neighbour import store_opened_while_the_index_is_held

from kernel_cache import Config, Entry, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.levels.disk.index import ENTRIES_DIR, INDEX, OLD_INDEX
from kernel_cache.levels.disk.level import DiskLevel
from kernel_cache.levels.disk.old_format import RawOnlyDisk

SMALL = [f"{i:032x}" for i in range(1, 4)]  # under diskcache's 32 KiB: kept inside its index
LARGE = [f"{i:032x}" for i in range(11, 13)]  # in value files
OLD_FILES = [OLD_INDEX, OLD_INDEX + "-wal", OLD_INDEX + "-shm"]


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # each test's warnings said afresh (conftest)


def _entry(key: str, size: int) -> Entry:
    return Entry(key=key, meta={"name": "k", "created": 1_000_000.0 + int(key, 16)}, blobs={"cubin": os.urandom(size)})


def older_cache(directory: Path) -> dict[str, bytes]:
    """A cache as an older kernel-cache left it, written with diskcache itself: its index with the
    settings that version used (values under 32 KiB inside it), entries small and large. Returns key -> bytes."""
    stored = {key: entry_format.encode(_entry(key, 200)) for key in SMALL}
    stored.update({key: entry_format.encode(_entry(key, 70_000)) for key in LARGE})
    with diskcache.Cache(str(directory / ENTRIES_DIR), disk=RawOnlyDisk, size_limit=1 << 30,
                         eviction_policy="least-recently-used", cull_limit=10, statistics=False,
                         disk_min_file_size=32768) as old:
        for key, data in stored.items():
            old.set(key, data)
    for name in ("locks", "stats"):
        (directory / name).mkdir(exist_ok=True)
    return stored


def _inline_and_files(directory: Path) -> tuple[int, int]:
    """(entries kept inside diskcache's index, value files): the fixture really is the older layout."""
    files = len(list((directory / ENTRIES_DIR).rglob("*.val")))
    with diskcache.Cache(str(directory / ENTRIES_DIR), disk=RawOnlyDisk, eviction_policy="none") as old:
        inline = sum(isinstance(old.get(key), bytes) for key in old.iterkeys())
    return inline, files


def test_the_first_writer_upgrades_an_older_cache_and_nothing_is_lost(tmp_path):
    directory = tmp_path / "cache"
    stored = older_cache(directory)
    assert _inline_and_files(directory) == (len(SMALL), len(LARGE))
    store = Store(Config(dir=directory))
    try:
        assert {key: store.get(key)[1] for key in stored} == dict.fromkeys(stored, "disk")
        assert {key: store.disk.peek_raw(key) for key in stored} == stored
        listed = {r["key"]: r for r in store.disk.listing()}
        assert set(listed) == set(stored)
        assert all(listed[k]["created"] == _entry(k, 1).meta["created"] for k in stored)  # its entry's time
    finally:
        store.close()
    entries = directory / ENTRIES_DIR
    assert [name for name in OLD_FILES if (entries / name).exists()] == []
    assert (entries / INDEX).is_file() and len(list(entries.rglob("*.val"))) == len(stored)
    with sqlite3.connect(entries / INDEX) as con:
        assert sorted(k for (k,) in con.execute("SELECT key FROM entries")) == sorted(stored)

    again = Store(Config(dir=directory))  # upgraded for good: an ordinary cache
    assert all(again.get(key)[1] == "disk" for key in stored) and again.disk.integrity_problem() is None
    again.close()


def test_a_pickled_row_in_an_older_index_is_never_loaded(tmp_path):
    directory = tmp_path / "cache"
    stored = older_cache(directory)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with diskcache.Cache(str(directory / ENTRIES_DIR)) as plain:  # diskcache's own Disk pickles what is not raw
        plain.set(f"{99:032x}", Payload())  # a pickled value under a content key
        plain.set(("not", "raw"), b"x")  # a pickled key
    store = Store(Config(dir=directory))
    try:
        assert store.get(f"{99:032x}") is None
        assert sorted(r["key"] for r in store.disk.listing()) == sorted(stored)
    finally:
        store.close()
    assert not marker.exists() and not (directory / ENTRIES_DIR / OLD_INDEX).exists()


def test_a_reader_finds_an_older_cache_not_indexed_yet_and_changes_nothing(tmp_path):
    directory = tmp_path / "cache"
    stored = older_cache(directory)

    def files() -> dict[str, int]:
        return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*")
                if not p.name.endswith(("-wal", "-shm"))}

    before = files()
    reader = DiskLevel(directory, read_only=True)
    assert reader.get(SMALL[0]) is None and reader.get(LARGE[0]) is None and reader.listing() == []
    assert files() == before

    writer = Store(Config(dir=directory))  # a process that writes upgrades it...
    writer.close()
    assert reader.get(SMALL[0]) is not None  # ...and the reader already open reads the new index
    assert {r["key"] for r in reader.listing()} == set(stored)
    reader.close()


def test_an_upgrade_a_neighbour_holds_up_is_done_by_a_later_writer(tmp_path):
    directory = tmp_path / "cache"
    stored = older_cache(directory)
    with store_opened_while_the_index_is_held(directory) as (store, caught):  # the neighbour, upgrading
        assert store.disk is not None
        assert any("cannot be written" in str(w.message) for w in caught)
        assert store.get(SMALL[0]) is None  # not indexed yet: a miss, never an error
        store.close()
        assert (directory / ENTRIES_DIR / OLD_INDEX).exists() and not (directory / ENTRIES_DIR / INDEX).exists()
    store = Store(Config(dir=directory))
    assert all(store.get(key)[1] == "disk" for key in stored)
    store.close()


def test_an_older_index_too_damaged_to_read_still_gives_up_its_value_files(tmp_path):
    directory = tmp_path / "cache"
    older_cache(directory)
    (directory / ENTRIES_DIR / OLD_INDEX).write_bytes(b"not a database" * 100)
    for name in OLD_FILES[1:]:
        (directory / ENTRIES_DIR / name).unlink(missing_ok=True)
    store = Store(Config(dir=directory))
    try:
        assert [store.get(key)[1] for key in LARGE] == ["disk"] * len(LARGE)  # the ones in files
        assert store.get(SMALL[0]) is None  # kept inside the unreadable index: lost, built again on use
    finally:
        store.close()
    assert not (directory / ENTRIES_DIR / OLD_INDEX).exists()


def test_an_older_index_an_upgrade_did_not_get_to_remove_is_debris(tmp_path):
    directory = tmp_path / "cache"
    stored = older_cache(directory)
    kept = (directory / ENTRIES_DIR / OLD_INDEX).read_bytes()
    Store(Config(dir=directory)).close()
    (directory / ENTRIES_DIR / OLD_INDEX).write_bytes(kept)  # as an upgrade killed before its last step leaves it
    level = DiskLevel(directory)
    assert {key: level.peek_raw(key) for key in stored} == stored  # our index is read, the old one ignored
    assert level.remove_debris(3600.0) == []  # too recent: a writer may be at work
    os.utime(directory / ENTRIES_DIR / OLD_INDEX, (1000.0, 1000.0))
    assert [Path(path).name for path, _ in level.remove_debris(3600.0)] == [OLD_INDEX]
    assert {key: level.peek_raw(key) for key in stored} == stored
    level.close()
