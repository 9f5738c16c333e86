"""Shared level in one process: layout, validation + quarantine, degraded filesystems, maintenance.

Entries are tiny synthetic ones: the level stores bytes and does not care what they encode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from kernel_cache import Config, CorruptEntry, Entry, KernelCacheWarning, Store
from kernel_cache.coordination import locks
from kernel_cache.entries import entry as entry_format
from kernel_cache.levels.shared import SharedLevel
from kernel_cache.telemetry import warnings_once
from kernel_cache.trust import safefs
from kernel_cache.trust.safefs import Tree

KEY = "0123456789abcdef0123456789abcdef"
KEY2 = "fedcba9876543210fedcba9876543210"


@pytest.fixture(autouse=True)
def _fresh_warnings():
    warnings_once.reset()
    yield
    warnings_once.reset()
    safefs.set_fault_hook(None)


def make_entry(key: str = KEY, size: int = 300) -> Entry:
    return Entry(key=key, meta={"kernel": "synthetic", "created": time.time()},
                 blobs={"cubin": bytes(range(256)) * (size // 256 + 1)})


class Builder:
    """A build function that counts its calls and returns deterministic bytes per key."""

    def __init__(self, key: str, size: int = 300):
        self.key, self.size, self.calls = key, size, 0

    def __call__(self):
        self.calls += 1
        e = make_entry(self.key, self.size)
        return {"kernel": "synthetic"}, e.blobs, 0.01


@pytest.fixture
def shared(tmp_path) -> Path:
    d = tmp_path / "shared"
    d.mkdir()
    return d


def store_for(tmp_path: Path, shared_dir: Path, name: str = "node", **config) -> Store:
    return Store(Config(dir=tmp_path / name, shared_dir=shared_dir, **config))


@contextlib.contextmanager
def recorded_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def kernel_cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]


@contextlib.contextmanager
def mounted(*args):
    """Run `mount args...` (root only); skip the test if this machine refuses."""
    target = Path(args[-1])
    target.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount here ({res.stderr.strip() or res.returncode})")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


# Basics ---------------------------------------------------------------------------------------
def test_round_trip_layout_and_no_temp_files(shared):
    level = SharedLevel(shared)
    entry = make_entry()
    level.put(entry)
    path = shared / "entries" / KEY[:2] / KEY
    assert path.is_file()
    assert sorted(os.listdir(path.parent)) == [KEY]  # the temp file was renamed, not left behind
    got = level.get(KEY)
    assert got.blobs == entry.blobs and got.meta["kernel"] == "synthetic"
    assert KEY in level and KEY2 not in level and level.get(KEY2) is None
    assert list(level.keys()) == [KEY] and len(level) == 1
    assert level.peek_raw(KEY) == entry_format.encode(entry)


def test_store_reads_through_shared_and_promotes_into_local(tmp_path, shared):
    a = store_for(tmp_path, shared, "node-a")
    build = Builder(KEY)
    meta, blobs = a.get_or_create(KEY, build)
    assert build.calls == 1
    assert a.disk.get(KEY) is not None and a.shared.get(KEY) is not None  # written through to both

    b = store_for(tmp_path, shared, "node-b")
    other = Builder(KEY)
    assert b.get_or_create(KEY, other)[1] == blobs and other.calls == 0
    assert b.stats.session()["hits"]["shared"] == 1
    assert b.disk.get(KEY).blobs == blobs  # the shared hit was copied into b's local level
    assert b.get(KEY)[1] == "memory"


def test_keys_must_be_content_addresses(shared):
    level = SharedLevel(shared)
    for bad in ("../../etc/passwd", "", "ab/cd", "x" * 32):
        with pytest.raises(ValueError):
            level.get(bad)


def test_put_raw_refuses_bytes_that_are_not_a_valid_entry_for_the_key(shared):
    level = SharedLevel(shared)
    data = entry_format.encode(make_entry())
    with pytest.raises(CorruptEntry):
        level.put_raw(KEY2, data)
    with pytest.raises(CorruptEntry):
        level.put_raw(KEY, data[:-1])
    assert len(level) == 0
    level.put_raw(KEY, data)
    assert level.get(KEY) is not None


# Corruption -----------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_shared_entry_is_quarantined_rebuilt_and_never_kept_locally(tmp_path, shared, damage):
    store_for(tmp_path, shared, "writer").get_or_create(KEY, Builder(KEY))
    path = shared / "entries" / KEY[:2] / KEY
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) - 7]
    path.write_bytes(bytes(data))

    reader = store_for(tmp_path, shared, "reader")
    with recorded_warnings() as caught:
        assert reader.get(KEY) is None  # detected: a miss, not a crash, not a bad kernel
    assert any("corrupt shared entry" in m for m in kernel_cache_warnings(caught))
    assert KEY not in reader.disk  # the bad copy was not promoted into the local level
    quarantined = reader.shared.quarantined()
    assert [q["key"] for q in quarantined] == [KEY]
    assert Path(quarantined[0]["path"]).read_bytes() == bytes(data)  # kept for inspection

    build = Builder(KEY)
    meta, blobs = reader.get_or_create(KEY, build)
    assert build.calls == 1
    assert reader.disk.get(KEY).blobs == blobs
    assert reader.shared.get(KEY).blobs == blobs  # republished, valid
    assert [path for path, _ in reader.shared.remove_quarantined()] == [quarantined[0]["path"]]
    assert reader.shared.quarantined() == []


# Degraded filesystems ---------------------------------------------------------------------------
def test_missing_shared_dir_degrades_with_one_warning(tmp_path):
    with recorded_warnings() as caught:
        store = store_for(tmp_path, tmp_path / "no-such-mount" / "cache")
        build = Builder(KEY)
        meta, blobs = store.get_or_create(KEY, build)
    assert store.shared is None and build.calls == 1 and blobs == make_entry().blobs
    assert store.disk.get(KEY) is not None
    messages = kernel_cache_warnings(caught)
    assert len(messages) == 1 and "does not exist" in messages[0]
    assert not (tmp_path / "no-such-mount").exists()  # a missing mount is not silently created


def test_read_only_shared_dir_serves_hits_and_skips_writes_quietly(tmp_path, shared, caplog):
    SharedLevel(shared).put(make_entry())
    before = sorted(str(p) for p in shared.rglob("*"))
    with mounted("--bind", str(shared), str(tmp_path / "ro")) as ro:
        res = subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {res.stderr.strip()}")
        caplog.set_level("INFO", logger="kernel_cache")
        with recorded_warnings() as caught:
            store = store_for(tmp_path, ro)
            hit = Builder(KEY)
            assert store.get_or_create(KEY, hit)[1] == make_entry().blobs and hit.calls == 0
            assert store.stats.session()["hits"]["shared"] == 1
            miss = Builder(KEY2)
            store.get_or_create(KEY2, miss)  # compiles; single-flight falls back to the node lock
            store.get_or_create(KEY2, miss)
        assert miss.calls == 1
        assert store.shared.writable is False
        assert kernel_cache_warnings(caught) == []
        assert sum("read-only" in r.getMessage() for r in caplog.records) == 1
        assert store.stats.session()["errors"] == 0
    assert sorted(str(p) for p in shared.rglob("*")) == before


def test_enospc_on_a_tiny_tmpfs_leaves_results_and_directory_intact(tmp_path):
    with mounted("-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(tmp_path / "tiny")) as tiny:
        store = store_for(tmp_path, tiny)
        with recorded_warnings() as caught:
            for key in (KEY, KEY2):
                build = Builder(key, size=256 * 1024)
                meta, blobs = store.get_or_create(key, build)
                assert build.calls == 1 and blobs == make_entry(key, 256 * 1024).blobs
                assert store.disk.get(key).blobs == blobs  # the local level still got it
        messages = kernel_cache_warnings(caught)
        assert len(messages) == 1 and "No space left" in messages[0]
        assert list(store.shared.keys()) == []
        leftovers = [p for p in (tiny / "entries").rglob("*") if p.is_file()]
        assert leftovers == []  # the partial temp file was removed


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.ESTALE])
def test_injected_publish_fault_degrades_with_one_warning_per_cause(tmp_path, shared, code):
    def fail(point, tmp):
        if tmp.startswith(str(shared / "entries")):  # (the local level publishes its entry files through the same hook)
            raise OSError(code, os.strerror(code))

    safefs.set_fault_hook(fail)
    store = store_for(tmp_path, shared)
    with recorded_warnings() as caught:
        for key in (KEY, KEY2):
            build = Builder(key)
            assert store.get_or_create(key, build)[1] == make_entry(key).blobs and build.calls == 1
    assert len(kernel_cache_warnings(caught)) == 1
    assert [p for p in (shared / "entries").rglob("*") if p.is_file()] == []
    safefs.set_fault_hook(None)
    store.put(make_entry(KEY))  # the level keeps working once the fault clears
    assert store.shared.get(KEY) is not None


def test_different_causes_each_get_their_own_warning(tmp_path, shared):
    codes = iter([errno.ENOSPC, errno.EIO, errno.ENOSPC])

    def fail(point, tmp):
        if tmp.startswith(str(shared / "entries")):  # (the local level publishes its entry files through the same hook)
            code = next(codes)
            raise OSError(code, os.strerror(code))

    safefs.set_fault_hook(fail)
    store = store_for(tmp_path, shared)
    with recorded_warnings() as caught:
        for key in (KEY, KEY2, "ab" * 16):
            store.get_or_create(key, Builder(key))
    assert len(kernel_cache_warnings(caught)) == 2


def test_stale_file_handle_on_read_is_retried(shared, monkeypatch):
    from kernel_cache.trust import safefs

    level = SharedLevel(shared)
    level.put(make_entry())
    real_read, failures = safefs.read_at, []

    def flaky_read(dir_fd, name, *args, **kw):
        if not failures:
            failures.append(name)
            raise OSError(errno.ESTALE, "Stale file handle")
        return real_read(dir_fd, name, *args, **kw)

    monkeypatch.setattr(safefs, "read_at", flaky_read)
    assert level.get(KEY) is not None and len(failures) == 1


def test_read_errors_degrade_to_compiling(tmp_path, shared, monkeypatch):
    store = store_for(tmp_path, shared)
    SharedLevel(shared).put(make_entry())

    def broken(self, parts):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(SharedLevel, "_read", broken)
    with recorded_warnings() as caught:
        build = Builder(KEY)
        assert store.get_or_create(KEY, build)[1] == make_entry().blobs and build.calls == 1
    assert len(kernel_cache_warnings(caught)) == 1


# Recency, permissions ---------------------------------------------------------------------------
def test_hits_touch_an_entry_at_most_once_per_interval(shared):
    level = SharedLevel(shared)
    level.put(make_entry())
    path = shared / "entries" / KEY[:2] / KEY
    recent = time.time() - 60
    os.utime(path, (recent, recent))
    level.get(KEY)
    assert os.stat(path).st_mtime == pytest.approx(recent)  # used within the hour: no write

    old = time.time() - 2 * 3600
    os.utime(path, (old, old))
    level.get(KEY)
    assert os.stat(path).st_mtime > time.time() - 60  # due: refreshed for LRU pruning
    (record,) = level.listing()
    assert record["last_used"] > time.time() - 60 and record["created"] <= record["last_used"]


def test_files_follow_umask_and_setgid_group_directory(shared):
    os.chmod(shared, 0o2775)
    old_umask = os.umask(0o002)
    try:
        level = SharedLevel(shared)
        level.put(make_entry())
        with level.lock(KEY, 1):
            pass
    finally:
        os.umask(old_umask)
    fanout = shared / "entries" / KEY[:2]
    assert stat.S_IMODE(os.stat(fanout).st_mode) == 0o2775  # group-writable, setgid inherited
    assert stat.S_IMODE(os.stat(fanout / KEY).st_mode) == 0o664


@pytest.mark.parametrize("mode, trusted", [(0o777, False), (0o1777, False), (0o2775, True), (0o755, True)])
def test_a_world_writable_dir_is_not_trusted_without_a_signing_key(tmp_path, shared, mode, trusted):
    os.chmod(shared, mode)
    with recorded_warnings() as caught:
        store = store_for(tmp_path, shared)
        store_for(tmp_path, shared, "again")
    messages = kernel_cache_warnings(caught)
    assert (store.shared is not None) is trusted
    assert len(messages) == (0 if trusted else 1)
    if not trusted:
        assert "writable by every user" in messages[0] and messages[0].lower().count("skipping") == 1


def test_a_world_writable_dir_with_a_signing_key_is_used_with_a_warning(shared):
    os.chmod(shared, 0o777)
    with recorded_warnings() as caught:
        level = SharedLevel(shared, authenticate=lambda data: None)
    assert level.writable
    (message,) = kernel_cache_warnings(caught)
    assert "writable by every user" in message and "signature" in message


# Maintenance hooks for cachectl -----------------------------------------------------------------
def test_records_prune_and_delete(shared):
    level = SharedLevel(shared)
    keys = [f"{i:02x}" * 16 for i in range(4)]
    now = time.time()
    for age, key in zip((40, 30, 20, 10), keys):
        level.put(make_entry(key, size=1000))
        os.utime(shared / "entries" / key[:2] / key, (now - age * 86400, now - age * 86400))
    records = {r["key"]: r for r in level.listing()}
    assert set(records) == set(keys)
    sizes = [records[k]["size_bytes"] for k in keys]
    assert sizes[0] == len(level.peek_raw(keys[0])) and level.volume() == sum(sizes)
    assert records[keys[0]]["last_used"] == pytest.approx(now - 40 * 86400)

    from cachectl.inventory import EntryFilter, plan_prune, remove_entries, scan

    infos = scan(level)
    old = plan_prune(infos, EntryFilter(older_than_seconds=35 * 86400), None)
    assert [i.key for i in old] == [keys[0]]
    lru = plan_prune(infos, EntryFilter(), sizes[2] + sizes[3])  # least recently used first
    assert [i.key for i in lru] == keys[:2]
    forgotten, failed = [], []
    assert remove_entries(level, lru, forgotten.append, failed) == sizes[0] + sizes[1]
    assert forgotten == keys[:2] and failed == []
    assert sorted(level.keys()) == sorted(keys[2:])
    assert level.delete(keys[2]) and not level.delete(keys[2])


def test_remove_debris_takes_old_temp_files_and_unheld_locks_only(shared):
    level = SharedLevel(shared)
    level.put(make_entry())
    fanout = shared / "entries" / KEY[:2]
    old_tmp = fanout / f".{KEY}.deadhost.123.abcd.tmp"
    new_tmp = fanout / f".{KEY}.livehost.456.ef01.tmp"
    for p in (old_tmp, new_tmp):
        p.write_bytes(b"partial")
    old = time.time() - 7200
    os.utime(old_tmp, (old, old))
    with level.lock(KEY2, 1) as held:
        assert held
    suffix = {"flock": ".lock", "soft": ".softlock"}[level.lock_kind]
    lock_file = shared / "locks" / KEY2[:2] / f"{KEY2}{suffix}"
    with level.lock(KEY, 1) as held:  # a held lock, even if old, stays
        held_file = shared / "locks" / KEY[:2] / f"{KEY}{suffix}"
        for p in (lock_file, held_file):
            os.utime(p, (old, old))
        removed = [path for path, _ in level.remove_debris(older_than_seconds=3600)]
    assert sorted(removed) == sorted([str(old_tmp), str(lock_file)])
    assert new_tmp.exists() and held_file.exists() and level.get(KEY) is not None


# Lock selection -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fs, options, coherent", [
    ("ext4", {"rw"}, True),
    ("tmpfs", set(), True),
    ("xfs", {"rw"}, True),
    ("nfs4", {"rw", "vers=4.2"}, True),
    ("nfs", {"rw", "local_lock=flock"}, False),
    ("nfs", {"rw", "local_lock=all"}, False),
    ("lustre", {"rw", "flock"}, True),
    ("lustre", {"rw", "localflock"}, False),
    ("fuse.sshfs", {"rw"}, False),
    ("cifs", {"rw"}, False),
    ("unknown", set(), False),
])
def test_flock_only_where_it_excludes_other_nodes(fs, options, coherent):
    assert locks.flock_is_coherent(fs, options) is coherent


def test_auto_lock_on_a_local_disk_is_flock_and_modes_can_be_forced(shared):
    fs_type, _ = locks.filesystem_of(shared)
    assert fs_type != "unknown"
    assert SharedLevel(shared).lock_kind == ("flock" if locks.flock_is_coherent(*locks.filesystem_of(shared))
                                            else "soft")
    assert SharedLevel(shared, lock_mode="soft").lock_kind == "soft"
    assert SharedLevel(shared, lock_mode="flock").lock_kind == "flock"
    with pytest.raises(ValueError):
        locks.choose_lock_kind(Tree(shared, None), (), "fcntl")


def test_auto_lock_on_tmpfs_mount_is_read_from_mountinfo(tmp_path):
    with mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path / "mnt")) as mnt:
        assert locks.filesystem_of(mnt / "sub")[0] == "tmpfs"
        assert locks.choose_lock_kind(Tree(mnt, None), ()) == "flock"


@pytest.mark.parametrize("kind", ["flock", "soft"])
def test_lock_wait_ends_when_the_entry_is_published(shared, kind):
    level = SharedLevel(shared, lock_mode=kind)
    with level.lock(KEY, 5) as first:
        assert first
        level.put(make_entry())  # the holder publishes while still holding the lock
        with level.lock(KEY, 30) as second:  # a waiter (another thread would behave the same)
            assert second is False and KEY in level
