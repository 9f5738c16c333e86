"""A hit's copy into the local disk (a backfill) is deferred and written in one batch: a fresh node
served by the cluster neither creates its index nor writes per hit while it lowers. Nothing is lost:
the copies are served meanwhile and written at the level's next write, its close, the process's
exit, or once they hold the bound; a delete or clear drops them."""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_python
from test_shared_level import make_entry

from kernel_cache import Config, Store
from kernel_cache.levels.disk import level as disk_module
from kernel_cache.levels.disk import sql as disk_sql
from kernel_cache.levels.disk.index import ENTRIES_DIR, INDEX

KEYS = [f"{i:x}" * 32 for i in range(1, 6)]
SIGNING_KEY = b"deferred-copies-signing-key-012345"


@pytest.fixture
def shared(tmp_path):
    """A shared directory holding KEYS, written by another node."""
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o700)
    writer = Store(Config(dir=tmp_path / "writer", shared_dir=directory, signing_key=SIGNING_KEY))
    for key in KEYS:
        writer.put(make_entry(key))
    writer.close()
    return directory


def fresh_node(path, shared) -> Store:
    return Store(Config(dir=path, shared_dir=shared, signing_key=SIGNING_KEY))


def on_disk(path) -> set[str]:
    """The keys a new process finds in the local cache at `path` (its index)."""
    store = Store(Config(dir=path))
    try:
        assert store.disk is not None
        return set(store.disk.keys())
    finally:
        store.close()


def test_a_fresh_node_writes_its_copies_once_at_close_and_serves_them_meanwhile(tmp_path, shared, monkeypatch):
    node = tmp_path / "node"
    store = fresh_node(node, shared)
    batches = []  # the keys of each write transaction
    real = disk_sql.put
    monkeypatch.setattr(disk_sql, "put", lambda db, timeout, rows, max_bytes:
                        (batches.append([row[0] for row in rows]), real(db, timeout, rows, max_bytes))[1])
    for key in KEYS[:3]:
        assert store.get(key)[1] == "shared"
    assert batches == [] and not (node / ENTRIES_DIR / INDEX).exists()  # no index made, nothing written yet
    disk = store.disk
    assert disk is not None
    store.memory.delete(KEYS[0])
    assert store.get(KEYS[0])[1] == "disk" and KEYS[1] in disk  # served from the deferred copies
    assert store.stats.session()["level_counts"]["disk"]["backfills"] == 3
    store.close()
    assert [sorted(batch) for batch in batches] == [sorted(KEYS[:3])]  # one batch, each once
    assert on_disk(node) == set(KEYS[:3])


def test_the_copies_are_written_at_exit_without_a_close(tmp_path, shared):
    node = tmp_path / "node"
    run_python(textwrap.dedent(f"""
        import kernel_cache
        store = kernel_cache.default_store()
        assert [store.get(k)[1] for k in {KEYS[:2]!r}] == ["shared", "shared"]
    """), env={"KERNEL_CACHE_DIR": str(node), "KERNEL_CACHE_SHARED_DIR": str(shared),
               "KERNEL_CACHE_SIGNING_KEY_FILE": _key_file(tmp_path)})
    assert on_disk(node) == set(KEYS[:2])


def test_a_store_opened_directly_and_never_closed_writes_its_copies_at_exit(tmp_path, shared):
    node = tmp_path / "node"
    run_python(textwrap.dedent(f"""
        from kernel_cache import Config, Store
        store = Store(Config(dir={str(node)!r}, shared_dir={str(shared)!r}, signing_key={SIGNING_KEY!r}))
        assert store.get({KEYS[3]!r})[1] == "shared"
    """))
    assert on_disk(node) == {KEYS[3]}


def _key_file(tmp_path) -> str:
    path = tmp_path / "signing.key"
    path.write_bytes(SIGNING_KEY)
    path.chmod(0o600)
    return str(path)


def test_a_write_takes_the_copies_with_it(tmp_path, shared):
    node = tmp_path / "node"
    store = fresh_node(node, shared)
    store.get(KEYS[0])
    store.put(make_entry("e" * 32))
    reader = Store(Config(dir=node))
    assert reader.disk is not None and set(reader.disk.keys()) == {KEYS[0], "e" * 32}  # before any close
    reader.close()
    store.close()


def test_past_the_bound_the_copies_are_written_at_once(tmp_path, shared, monkeypatch):
    monkeypatch.setattr(disk_module, "MAX_DEFERRED_BYTES", 1)
    node = tmp_path / "node"
    store = fresh_node(node, shared)
    store.get(KEYS[0])
    assert on_disk(node) == {KEYS[0]}
    store.close()


def test_a_delete_or_a_clear_drops_a_deferred_copy(tmp_path, shared):
    node = tmp_path / "node"
    store = fresh_node(node, shared)
    store.get(KEYS[0])
    store.get(KEYS[1])
    assert store.disk is not None
    store.disk.delete(KEYS[0])
    assert KEYS[0] not in store.disk and KEYS[1] in store.disk
    store.close()
    assert on_disk(node) == {KEYS[1]}

    again = fresh_node(tmp_path / "again", shared)
    again.get(KEYS[2])
    assert again.disk is not None
    again.disk.clear()
    again.close()
    assert on_disk(tmp_path / "again") == set()


def test_a_new_cache_that_only_missed_gets_its_empty_index_at_close(tmp_path, shared):
    node = tmp_path / "node"
    store = fresh_node(node, shared)
    assert store.get("0" * 31 + "9") is None
    assert store.disk is not None and "0" * 31 + "9" not in store.disk
    assert not (node / ENTRIES_DIR / INDEX).exists()
    store.close()
    assert (node / ENTRIES_DIR / INDEX).exists() and on_disk(node) == set()


def test_a_new_cache_whose_index_a_neighbour_created_meanwhile_is_read(tmp_path, shared):
    node = tmp_path / "node"
    store = fresh_node(node, shared)
    neighbour = fresh_node(node, shared)
    neighbour.put(make_entry("e" * 32))  # creates the index and writes
    assert store.get("e" * 32)[1] == "disk"
    assert store.get(KEYS[0])[1] == "shared"
    neighbour.close()
    store.close()
    assert on_disk(node) == {"e" * 32, KEYS[0]}


def test_threads_reading_a_new_cache_while_another_creates_its_index_see_misses(tmp_path, monkeypatch):
    """A new cache's index is created by its first write; a thread reading meanwhile (the index file
    there, its tables not yet) gets a miss, never a read error, and reads the entry once written."""
    import threading

    store = Store(Config(dir=tmp_path / "new"))
    level = store.disk
    assert level is not None
    real_open = disk_module.DiskLevel._open_writer
    creating = threading.Event()

    def opening(self):  # the readers start as the index's creation begins (the file appears before its tables)
        creating.set()
        return real_open(self)

    monkeypatch.setattr(disk_module.DiskLevel, "_open_writer", opening)
    errors, found = [], []

    def read() -> None:
        creating.wait(5)
        for _ in range(400):
            try:
                found.append(level.get(KEYS[0]) is not None)
            except Exception as exc:  # what Store would warn about as a failing level
                errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for thread in readers:
        thread.start()
    level.put(make_entry(KEYS[0]))
    for thread in readers:
        thread.join()
    assert errors == []
    assert level.get(KEYS[0]) is not None
    store.close()


def test_a_process_opening_while_a_neighbour_creates_the_index_is_a_new_cache_not_memory_only(tmp_path, monkeypatch):
    """Another process's first write is creating the index (the file there, no tables yet) and this
    process's writer cannot wait it out: the level opens as a new cache (misses, not a level dropped
    for memory only), reads the neighbour's entries once its index is readable, and writes after the
    writer's cooldown (it says meanwhile that new kernels stay in memory)."""
    import sqlite3

    node = tmp_path / "node"
    (node / ENTRIES_DIR).mkdir(parents=True)
    sqlite3.connect(node / ENTRIES_DIR / INDEX).execute("PRAGMA user_version = 1").connection.close()  # no tables

    def busy(self):
        raise sqlite3.OperationalError("database is locked")

    with monkeypatch.context() as patch:
        patch.setattr(disk_module.DiskLevel, "_open_writer", busy)
        store = Store(Config(dir=node))
    assert store.disk is not None and "disk" not in store.unavailable
    assert store.get(KEYS[0]) is None
    neighbour = Store(Config(dir=node))  # its writer makes the tables
    neighbour.put(make_entry(KEYS[0]))
    neighbour.close()
    assert store.get(KEYS[0])[1] == "disk"
    monkeypatch.setattr(disk_module, "BUSY_COOLDOWN", 0.0)
    store.disk._reopen_at = 0.0  # the cooldown over
    store.put(make_entry(KEYS[1]))
    store.close()
    assert on_disk(node) == {KEYS[0], KEYS[1]}


def test_an_index_without_tables_beside_entry_files_is_still_damage(tmp_path):
    """What a neighbour creating its index never leaves: entry files and an index without tables."""
    import sqlite3

    node = tmp_path / "node"
    store = Store(Config(dir=node))
    store.put(make_entry(KEYS[0]))
    store.close()
    (node / ENTRIES_DIR / INDEX).unlink()
    sqlite3.connect(node / ENTRIES_DIR / INDEX).execute("PRAGMA user_version = 1").connection.close()
    store = Store(Config(dir=node))
    try:
        assert store.get(KEYS[0]) is not None  # rebuilt from the entry files, as damage is
        assert store.healed_index is not None
    finally:
        store.close()


def test_close_closes_every_threads_reader(tmp_path):
    """Each thread reads the index through its own connection; close() closes all of them, those of
    threads that have ended and of one still running, not only the caller's (left to the collector,
    Python 3.13 warns of each)."""
    import sqlite3
    import threading

    level = disk_module.DiskLevel(tmp_path / "cache")
    level.put(make_entry("a" * 32))

    def read() -> None:
        assert level.get("a" * 32) is not None

    for _ in range(3):
        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
    read_once, closed = threading.Event(), threading.Event()

    def live() -> None:
        read()
        read_once.set()
        closed.wait(10)

    worker = threading.Thread(target=live)
    worker.start()
    assert read_once.wait(10)
    read()
    readers = list(level._reader_cons.values())
    assert len(readers) == 5 and len(set(map(id, readers))) == 5  # 3 ended threads, the worker, this one
    level.close()
    closed.set()
    worker.join(10)
    for con in readers:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            con.execute("select 1")
    assert level._reader_cons == {}


def test_a_closed_level_takes_no_more_writes_and_says_nothing(tmp_path):
    """What a dropped session still hands its level (its warm set, saved at exit) is not written."""
    import warnings

    from kernel_cache.entries import entry as entry_format

    level = disk_module.DiskLevel(tmp_path / "cache")
    level.put(make_entry(KEYS[0]))
    level.close()
    assert not level.writable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        level.keep_later(make_entry(KEYS[1]), entry_format.encode(make_entry(KEYS[1])))
        disk_module.flush_at_exit()
    assert on_disk(tmp_path / "cache") == {KEYS[0]}
