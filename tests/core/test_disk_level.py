"""The local level (kernel_cache/levels/disk.py): one key-named entry file per entry, recency its
mtime, a size bound kept with least-recently-used eviction; entry files read through safefs (a
vanished one a miss, a planted link, FIFO, directory or giant refused and removed without blocking);
a full disk or a read-only directory still serving hits; a neighbour's per-key lock waited on for a
bounded time; debris (a crashed writer's temp files, free lock files, the index layout's files)
swept by prune, the index layout itself never read."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from conftest import ROOT, child_env
from test_shared_level import Builder, kernel_cache_warnings, make_entry, recorded_warnings

from kernel_cache import Config, CorruptEntry, Entry, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.levels.disk import FILL_AFTER_EVICTION, DiskLevel
from kernel_cache.trust import safefs

KEYS = [f"{i:032x}" for i in range(1, 13)]

pytestmark = pytest.mark.usefixtures("fresh_warnings")  # each test's warnings said afresh (conftest)


def _entry(key: str, size: int = 2000) -> Entry:
    """Entries of one size: the same blob size and a fixed creation time."""
    return Entry(key=key, meta={"name": "k", "created": 1_000_000.0}, blobs={"cubin": b"c" * size})


SIZE = len(entry_format.encode(_entry(KEYS[0])))  # the bytes of each entry file


def path_of(directory: Path, key: str) -> Path:
    return directory / "entries" / key[:2] / key


def _age(directory: Path, used: dict[str, float]) -> None:
    """Set the last use (the mtime) of entries."""
    for key, when in used.items():
        os.utime(path_of(directory, key), (when, when))


def _files(directory: Path) -> dict[str, int]:
    """Every path under `directory` with its mtime (what a reader must leave as it found it)."""
    return {str(p.relative_to(directory)): p.lstat().st_mtime_ns for p in directory.rglob("*")}


def cachectl(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_cache", *map(str, args)], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)


# The bound --------------------------------------------------------------------------------------
def test_an_entry_is_one_file_named_by_its_key(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    assert sorted(os.listdir(directory / "entries" / KEYS[0][:2])) == [KEYS[0]]  # no temp file left
    assert path_of(directory, KEYS[0]).read_bytes() == entry_format.encode(_entry(KEYS[0]))
    assert level.get(KEYS[0]).blobs == _entry(KEYS[0]).blobs and level.volume() == SIZE
    level.put(_entry(KEYS[0], 100))  # a rewrite replaces the file
    assert len(level.get(KEYS[0]).blobs["cubin"]) == 100 and len(level) == 1
    assert level.delete(KEYS[0]) and not path_of(directory, KEYS[0]).exists() and list(level.keys()) == []
    level.close()


def test_a_write_past_the_bound_evicts_the_least_recently_used(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 30)
    for key in KEYS[:4]:
        level.put(_entry(key))
    _age(directory, {KEYS[0]: 4000.0, KEYS[1]: 1000.0, KEYS[2]: 3000.0, KEYS[3]: 2000.0})
    level.close()

    level = DiskLevel(directory, 4 * SIZE + SIZE // 2)  # room for four: the fifth write evicts the least recently used
    level.put(_entry(KEYS[4]))
    assert set(level.keys()) == {KEYS[0], KEYS[2], KEYS[3], KEYS[4]} and not path_of(directory, KEYS[1]).exists()
    level.max_bytes = 3 * SIZE + SIZE // 2  # room for three: the next write evicts the two least recently used
    level.put(_entry(KEYS[5]))
    assert set(level.keys()) == {KEYS[0], KEYS[4], KEYS[5]}
    assert level.volume() <= 3 * SIZE + SIZE // 2
    assert level.get(KEYS[1]) is None and level.get(KEYS[0]) is not None
    level.close()


def test_an_eviction_leaves_room_below_the_bound_and_cull_evicts_to_it(tmp_path):
    directory = tmp_path / "c"
    bound = 10 * SIZE
    level = DiskLevel(directory, bound)
    for n, key in enumerate(KEYS[:10]):
        level.put(_entry(key))
        _age(directory, {key: 1000.0 * (n + 1)})
    assert len(level) == 10  # exactly at the bound: nothing evicted
    level.put(_entry(KEYS[10]))  # past it: down to FILL_AFTER_EVICTION of the bound
    assert level.volume() <= bound * FILL_AFTER_EVICTION and len(level) == 9
    assert set(level.keys()) == {*KEYS[2:11]}  # the two least recently used went

    level.max_bytes = 5 * SIZE + SIZE // 2  # a smaller bound evicts nothing until a write or a cull
    assert len(level) == 9
    assert level.cull() == 4 and set(level.keys()) == {*KEYS[6:11]}  # down to the bound itself
    assert level.cull() == 0
    assert level.cull(0.0) == 5 and list(level.keys()) == []
    level.close()


def test_the_running_total_counts_a_neighbours_writes_at_its_next_walk(tmp_path):
    directory = tmp_path / "c"
    mine = DiskLevel(directory, 4 * SIZE + SIZE // 2)
    neighbour = DiskLevel(directory, 1 << 30)
    mine.put(_entry(KEYS[0]))  # its first write walks the directory: one entry
    for key in KEYS[1:4]:
        neighbour.put(_entry(key))
    mine.put(_entry(KEYS[4]))  # its own total is two entries: no walk per write, nothing evicted yet
    assert len(mine) == 5
    _age(directory, {key: 1000.0 * (n + 1) for n, key in enumerate(KEYS[:5])})
    for key in KEYS[5:8]:  # the third write takes its total past the bound: it walks, counting the neighbour's
        mine.put(_entry(key))
    assert set(mine.keys()) == {*KEYS[4:8]} and mine.volume() <= 4 * SIZE + SIZE // 2
    _age(directory, {key: 6000.0 + n for n, key in enumerate(KEYS[4:8])})
    mine.put(_entry(KEYS[8]))  # the total the walk found is the true one: this write evicts again
    assert set(mine.keys()) == {*KEYS[5:9]}
    mine.close()
    neighbour.close()


def test_a_hit_records_its_use_at_most_once_a_minute(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    recent = time.time() - 30
    _age(directory, {KEYS[0]: recent})
    assert level.get(KEYS[0]) is not None and path_of(directory, KEYS[0]).stat().st_mtime == pytest.approx(recent)
    _age(directory, {KEYS[0]: 1000.0})
    assert level.get(KEYS[0]) is not None and path_of(directory, KEYS[0]).stat().st_mtime > time.time() - 60
    assert level.peek_raw(KEYS[0]) is not None
    _age(directory, {KEYS[0]: 1000.0})
    assert level.peek_raw(KEYS[0]) is not None and path_of(directory, KEYS[0]).stat().st_mtime == 1000.0
    level.close()


def test_touched_entries_get_their_use_recorded_at_close_without_being_read(tmp_path, monkeypatch):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    for key in KEYS[:3]:
        level.put(_entry(key))
    _age(directory, dict.fromkeys(KEYS[:3], 1000.0))
    level.touch([KEYS[0], KEYS[2]])
    assert path_of(directory, KEYS[0]).stat().st_mtime == 1000.0  # not before the flush
    monkeypatch.setattr(level.tree, "read", lambda *a, **k: (_ for _ in ()).throw(AssertionError("read")))
    level.close()
    used = {key: path_of(directory, key).stat().st_mtime for key in KEYS[:3]}
    assert used[KEYS[1]] == 1000.0 and used[KEYS[0]] > time.time() - 60 and used[KEYS[2]] > time.time() - 60
    monkeypatch.undo()
    reader = DiskLevel(directory, 1 << 20)
    assert {r["key"]: r["created"] for r in reader.listing()}[KEYS[0]] == 1_000_000.0  # a use keeps its creation time
    reader.close()


# Neighbours ------------------------------------------------------------------------------------
def test_an_entry_a_neighbour_evicts_between_lookup_and_read_is_a_miss_not_an_error(tmp_path, monkeypatch):
    directory = tmp_path / "c"
    DiskLevel(directory, 1 << 20).put(_entry(KEYS[0]))
    store = Store(Config(dir=directory))
    neighbour = DiskLevel(directory, 0)  # a bound of nothing: its cull evicts every entry
    assert store.disk is not None and KEYS[0] in store.disk  # the lookup finds it...
    real_read = store.disk.tree.read

    def evicted_first(*parts, **kwargs):
        if parts[:1] == ("entries",):
            neighbour.cull()  # ...and the neighbour evicts it before the read
        return real_read(*parts, **kwargs)

    monkeypatch.setattr(store.disk.tree, "read", evicted_first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.get(KEYS[0]) is None  # a miss: no CorruptEntry, nothing said
        build = Builder(KEYS[0])
        assert store.get_or_create(KEYS[0], build)[1] == make_entry(KEYS[0]).blobs and build.calls == 1
    assert store.stats.session()["misses"] >= 1
    monkeypatch.undo()
    store.close()
    neighbour.close()


HOLD_LOCK = """
import fcntl, os, sys, time
path, seconds, publish = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
os.makedirs(os.path.dirname(path), exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
time.sleep(seconds)
if publish:
    from kernel_cache import Entry
    from kernel_cache.levels.disk import DiskLevel
    key = publish[1]
    DiskLevel(publish[0]).put(Entry(key=key, meta={"kernel": "neighbour"}, blobs={"cubin": b"neighbour's"}))
    print("published", flush=True)
    time.sleep(60)
"""


def _hold_lock(directory: Path, key: str, seconds: float, publish: bool = False) -> subprocess.Popen:
    DiskLevel(directory).close()  # the layout
    lock = directory / "locks" / key[:2] / f"{key}.lock"
    args = [str(directory), key] if publish else []
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock), str(seconds), *args], cwd=ROOT,
                              env=child_env(), stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


def test_a_neighbour_holding_a_keys_lock_delays_its_compile_only_boundedly(tmp_path):
    directory = tmp_path / "c"
    holder = _hold_lock(directory, KEYS[0], 120)
    try:
        store = Store(Config(dir=directory, lock_timeout=0.5))
        start = time.monotonic()
        with recorded_warnings():
            build = Builder(KEYS[0])
            assert store.get_or_create(KEYS[0], build)[1] == make_entry(KEYS[0]).blobs
        assert build.calls == 1 and time.monotonic() - start < 10  # waited the timeout, not for the holder
        store.memory.delete(KEYS[0])
        assert store.get(KEYS[0])[1] == "disk"  # and kept it
        other = Builder(KEYS[1])  # another key is not held up at all
        assert store.get_or_create(KEYS[1], other)[1] == make_entry(KEYS[1]).blobs and other.calls == 1
        store.close()
    finally:
        holder.kill()
        holder.wait()


def test_a_waiter_is_served_what_the_lock_holder_publishes(tmp_path):
    directory = tmp_path / "c"
    holder = _hold_lock(directory, KEYS[0], 0.5, publish=True)
    try:
        store = Store(Config(dir=directory, lock_timeout=30))
        start = time.monotonic()
        build = Builder(KEYS[0])
        assert store.get_or_create(KEYS[0], build)[1] == {"cubin": b"neighbour's"}
        assert build.calls == 0 and time.monotonic() - start < 25
        store.close()
    finally:
        holder.kill()
        holder.wait()


# Planted and damaged entry files -------------------------------------------------------------
def _plant(directory: Path, key: str, kind: str, victim: Path) -> str:
    """Put something other than `key`'s entry at its path; what its refusal says."""
    path = path_of(directory, key)
    good = entry_format.encode(make_entry(key))
    path.unlink(missing_ok=True)
    if kind == "symlink":
        os.symlink(victim, path)
        return "symbolic link"
    if kind == "fifo":
        os.mkfifo(path)
        return "not a regular file"
    if kind == "directory":
        (path / "a" / "b").mkdir(parents=True)
        (path / "a" / "b" / "f").write_bytes(b"x")
        return "not a regular file"
    if kind == "oversized":
        with open(path, "wb") as f:
            f.truncate(3 << 30)  # 3 GiB, no blocks
        return "cap"
    data = {"truncated": good[: len(good) // 2], "empty": b"",
            "flipped": good[:-10] + bytes([good[-10] ^ 0xFF]) + good[-9:],
            "another-key": entry_format.encode(make_entry(KEYS[1]))}[kind]
    path.write_bytes(data)
    return ""


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "oversized", "truncated", "empty", "flipped",
                                  "another-key"])
def test_a_bad_entry_file_is_refused_removed_and_compiled_again(tmp_path, kind):
    directory = tmp_path / "c"
    victim = tmp_path / "victim"
    victim.write_bytes(b"the operator's file")
    Store(Config(dir=directory)).get_or_create(KEYS[0], Builder(KEYS[0]))
    says = _plant(directory, KEYS[0], kind, victim)
    level = DiskLevel(directory, 1 << 40, max_entry_bytes=1 << 20)
    found: list[object] = []

    def read() -> None:
        try:
            found.append(level.get(KEYS[0]))
        except Exception as exc:
            found.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "the reader blocked on the planted file"
    (error,) = found
    assert isinstance(error, CorruptEntry) and says in str(error), error
    assert not os.path.lexists(path_of(directory, KEYS[0]))  # removed, not quarantined
    assert not (directory / "quarantine").exists()
    assert victim.read_bytes() == b"the operator's file"
    assert level.get(KEYS[0]) is None  # the next reader misses
    level.close()

    _plant(directory, KEYS[0], kind, victim)  # the store: a miss, compiled again over it, said once
    store = Store(Config(dir=directory))
    with recorded_warnings() as caught:
        build = Builder(KEYS[0])
        assert store.get_or_create(KEYS[0], build)[1] == make_entry(KEYS[0]).blobs and build.calls == 1
    assert len(kernel_cache_warnings(caught)) == 1
    assert entry_format.decode(path_of(directory, KEYS[0]).read_bytes(), expected_key=KEYS[0]).blobs == \
        make_entry(KEYS[0]).blobs
    assert victim.read_bytes() == b"the operator's file"
    store.close()


def test_a_directory_planted_at_an_entry_path_is_replaced_by_the_published_entry(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    planted = path_of(directory, KEYS[0])
    (planted / "deep").mkdir(parents=True)
    level.put(_entry(KEYS[0]))  # the write moves the planted directory out of the way
    assert planted.is_file() and level.get(KEYS[0]).blobs == _entry(KEYS[0]).blobs
    level.close()


def test_names_other_than_keys_are_neither_listed_nor_read_nor_removed(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    level.put(_entry(KEYS[0]))
    foreign = [directory / "entries" / KEYS[0][:2] / "README.txt", directory / "entries" / "zz-not-hex" / "x",
               directory / "entries" / "ff" / KEYS[0]]  # a key in another key's folder
    for path in foreign:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(entry_format.encode(_entry(KEYS[0])))
    assert list(level.keys()) == [KEYS[0]] and len(level) == 1 and level.volume() == SIZE
    assert [r["key"] for r in level.listing()] == [KEYS[0]]
    assert level.remove_debris(0.0) == [] and all(path.exists() for path in foreign)
    assert level.delete(KEYS[0]) and all(path.exists() for path in foreign)
    level.close()


# A full disk, a read-only directory ------------------------------------------------------------
def test_a_full_disk_serves_hits_and_compiles_misses_with_one_warning(tmp_path):
    directory = tmp_path / "c"
    DiskLevel(directory).put(make_entry(KEYS[0]))

    def full(point: str, temp: str) -> None:
        if temp.startswith(str(directory / "entries")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    store = Store(Config(dir=directory))
    safefs.set_fault_hook(full)
    try:
        with recorded_warnings() as caught:
            assert store.get(KEYS[0])[1] == "disk"
            for key in KEYS[1:4]:
                build = Builder(key)
                assert store.get_or_create(key, build)[1] == make_entry(key).blobs and build.calls == 1
        (message,) = kernel_cache_warnings(caught)
        assert "No space left" in message
        assert sorted(p.name for p in (directory / "entries").rglob("*") if p.is_file()) == [KEYS[0]]  # no temp files
        assert [r["key"] for r in store.disk.listing()] == [KEYS[0]]
        assert store.get(KEYS[1])[1] == "memory"
    finally:
        safefs.set_fault_hook(None)
    store.put(make_entry(KEYS[4]))  # the level writes again once there is room
    assert KEYS[4] in store.disk and store.disk.get(KEYS[4]) is not None
    store.close()


def test_a_read_only_view_serves_hits_and_lists_and_changes_nothing(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    for key in KEYS[:2]:
        level.put(make_entry(key))
    level.close()
    _age(directory, dict.fromkeys(KEYS[:2], 1000.0))
    before = _files(directory)
    store = Store(Config(dir=directory), read_only=True)
    assert store.disk is not None and not store.disk.writable
    with recorded_warnings() as caught:
        assert [store.get(key)[1] for key in KEYS[:2]] == ["disk", "disk"]
        build = Builder(KEYS[2])
        assert store.get_or_create(KEYS[2], build)[1] == make_entry(KEYS[2]).blobs and build.calls == 1
    assert kernel_cache_warnings(caught) == []
    assert sorted(r["key"] for r in store.disk.listing()) == KEYS[:2] and len(store.disk) == 2
    store.disk.touch(KEYS[:2])
    store.close()
    assert _files(directory) == before  # no entry, recency, lock or marker written


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a directory without write permission")
def test_a_directory_without_write_access_serves_hits_and_lists(tmp_path):
    directory = tmp_path / "c"
    DiskLevel(directory).put(make_entry(KEYS[0]))
    for path in [directory, *directory.rglob("*")]:
        if path.is_dir():
            path.chmod(0o555)
    try:
        with recorded_warnings() as caught:
            store = Store(Config(dir=directory))
            assert store.get(KEYS[0])[1] == "disk"
            assert store.get_or_create(KEYS[1], Builder(KEYS[1]))[1] == make_entry(KEYS[1]).blobs
        assert len(kernel_cache_warnings(caught)) == 1 and "cannot be written" in kernel_cache_warnings(caught)[0]
        assert [r["key"] for r in store.disk.listing()] == [KEYS[0]]
        store.close()
    finally:
        for path in [directory, *directory.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)


# Debris ---------------------------------------------------------------------------------------
def _index_layout(directory: Path, entries: dict[str, bytes]) -> list[Path]:
    """The files a cache written by the index layout held: value files under entries/aa/bb/, its
    SQLite index and an older diskcache index with their journals, diskcache's counters index under
    stats/, flat lock files. Returns those paths."""
    made = []
    for key, data in entries.items():
        value = directory / "entries" / key[:2] / key[2:4] / f"{key[4:]}.val"
        value.parent.mkdir(parents=True, exist_ok=True)
        value.write_bytes(data)
        made.append(value)
    for name in ("index.db", "index.db-wal", "index.db-shm", "cache.db"):
        made.append(directory / "entries" / name)
        made[-1].write_bytes(b"SQLite format 3\0" + bytes(100))
    (directory / "stats").mkdir(exist_ok=True)
    made.append(directory / "stats" / "cache.db")
    made[-1].write_bytes(b"SQLite format 3\0" + bytes(100))
    (directory / "locks").mkdir(exist_ok=True)
    for name in ("index.lock", f"{KEYS[5]}.lock"):
        made.append(directory / "locks" / name)
        made[-1].write_bytes(b"")
    return made


def test_debris_is_removed_and_entries_and_recent_work_are_kept(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    for key in KEYS[:2]:
        level.put(_entry(key))
    old = time.time() - 7200
    crashed = directory / "entries" / KEYS[0][:2] / f".{KEYS[2]}.host.123.abcd.tmp"
    writing = directory / "entries" / KEYS[0][:2] / f".{KEYS[3]}.host.124.abcd.tmp"
    for temp in (crashed, writing):
        temp.write_bytes(b"partial")
    os.utime(crashed, (old, old))
    planted = path_of(directory, KEYS[4])
    (planted / "deep").mkdir(parents=True)
    fifo = directory / "entries" / "ab" / ("ab" + KEYS[5][2:])
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with level.lock(KEYS[6], 1.0) as held:  # a lock file of ours, free once this block ends
        assert held
    lock = directory / "locks" / KEYS[6][:2] / f"{KEYS[6]}.lock"
    assert lock.exists()
    index_files = _index_layout(directory, {KEYS[7]: entry_format.encode(_entry(KEYS[7]))})
    value_folder = directory / "entries" / KEYS[7][:2] / KEYS[7][2:4]

    removed = {Path(p) for p, _ in level.remove_debris(3600.0)}
    assert removed == {crashed, planted, fifo, value_folder} | {p for p in index_files if p.suffix != ".val"}
    assert not crashed.exists() and not os.path.lexists(planted) and not os.path.lexists(fifo)
    assert [p for p in index_files if os.path.lexists(p)] == []  # never this layout's: gone at once when free
    assert writing.exists() and lock.exists()  # too recent: a writer may be at work, a lock may be taken
    assert set(level.keys()) == set(KEYS[:2])

    for path in (writing, lock):
        os.utime(path, (old, old))
    removed = {Path(p) for p, _ in level.remove_debris(3600.0)}
    assert removed == {writing, lock}
    assert set(level.keys()) == set(KEYS[:2]) and level.remove_debris(0.0) == []
    assert [level.get(key).blobs for key in KEYS[:2]] == [_entry(key).blobs for key in KEYS[:2]]
    level.close()


def test_a_held_lock_file_is_not_debris(tmp_path):
    directory = tmp_path / "c"
    level = DiskLevel(directory, 1 << 20)
    with level.lock(KEYS[0], 1.0) as held:
        assert held
        lock = directory / "locks" / KEYS[0][:2] / f"{KEYS[0]}.lock"
        os.utime(lock, (1000.0, 1000.0))
        neighbour = DiskLevel(directory, 1 << 20)  # another opening: its own lock file description
        assert neighbour.remove_debris(60.0) == [] and lock.exists()
        neighbour.close()
    level.close()


def test_a_cache_written_by_the_index_layout_is_not_read_and_prune_removes_its_files(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    stored = {key: entry_format.encode(make_entry(key)) for key in KEYS[:3]}
    index_files = _index_layout(directory, stored)
    store = Store(Config(dir=directory))
    try:
        assert store.disk is not None and "disk" not in store.unavailable
        assert store.disk.listing() == [] and len(store.disk) == 0  # its value files are not entries
        with recorded_warnings() as caught:
            for key in KEYS[:3]:
                build = Builder(key)
                assert store.get_or_create(key, build)[1] == make_entry(key).blobs and build.calls == 1
        assert kernel_cache_warnings(caught) == []
        assert sorted(store.disk.keys()) == KEYS[:3]
    finally:
        store.close()
    assert all(p.exists() for p in index_files)  # a process using the cache leaves them to prune

    old = time.time() - 7200
    for path in index_files:
        os.utime(path, (old, old))
    pruned = cachectl("--dir", directory, "prune", "--json")
    assert pruned.returncode == 0, pruned.stderr
    debris = {d["path"] for d in json.loads(pruned.stdout)["debris"]}
    value_folders = {str(directory / "entries" / key[:2] / key[2:4]) for key in KEYS[:3]}
    assert debris >= {str(p) for p in index_files if p.suffix != ".val"} | value_folders
    assert [p for p in index_files if os.path.lexists(p)] == []
    assert sorted(p.name for p in (directory / "entries").rglob("*") if p.is_file()) == sorted(KEYS[:3])
    again = Store(Config(dir=directory))
    assert [again.get(key)[1] for key in KEYS[:3]] == ["disk"] * 3
    again.close()
