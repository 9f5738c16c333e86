"""kernel_cache: entry format, levels, single-flight, stats, config, degradation."""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
import threading
import time
import warnings

import pytest
from conftest import child_env, run_python

import kernel_cache
from kernel_cache import Config, ConfigError, CorruptEntry, Entry, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.levels.disk import DiskLevel
from kernel_cache.levels.memory import MemoryLevel

K = "1" * 32
K1 = "2" * 32
K2 = "3" * 32


def _entry(key="c" * 32, size=1000, **meta):
    return Entry(key=key, meta={"name": "kern", "compile_seconds": 0.5, **meta},
                 blobs={"cubin": os.urandom(size), "ptx": b"// ptx"})


pytestmark = pytest.mark.usefixtures("fresh_warnings")  # each test's warnings said afresh (conftest)


# Entry format -------------------------------------------------------------------------------
def test_entry_round_trip():
    e = _entry()
    back = entry_format.decode(entry_format.encode(e), expected_key=e.key)
    assert back.key == e.key and back.blobs == e.blobs and back.meta == e.meta


def test_every_flipped_byte_is_detected():
    data = bytearray(entry_format.encode(_entry(size=64)))
    for pos in range(len(data)):
        corrupted = bytearray(data)
        corrupted[pos] ^= 0x01
        with pytest.raises(CorruptEntry):
            entry_format.decode(bytes(corrupted), expected_key="c" * 32)


@pytest.mark.parametrize("cut", [0, 5, 40, 100, -1])
def test_truncated_entries_are_detected(cut):
    data = entry_format.encode(_entry())
    with pytest.raises(CorruptEntry):
        entry_format.decode(data[:cut])


def test_entry_for_another_key_is_rejected():
    data = entry_format.encode(_entry(key="a" * 32))
    with pytest.raises(CorruptEntry, match="expected"):
        entry_format.decode(data, expected_key="b" * 32)


# Memory level --------------------------------------------------------------------------------
def test_memory_level_evicts_least_recently_used_by_bytes_and_items():
    level = MemoryLevel(max_bytes=3500, max_items=10)
    for name in "abc":
        level.put(_entry(key=name, size=1000))
    level.get("a")  # a is now most recently used
    level.put(_entry(key="d", size=1000))
    assert level.get("b") is None and all(level.get(k) for k in "acd")
    items = MemoryLevel(max_bytes=1 << 20, max_items=2)
    for name in "xyz":
        items.put(_entry(key=name, size=10))
    assert items.get("x") is None and len(items) == 2
    level.put(_entry(key="e" * 32, size=10_000))  # larger than the level: not kept, nothing evicted
    assert level.get("e" * 32) is None and len(level) == 3


def test_memory_level_is_thread_safe():
    level = MemoryLevel(max_bytes=50_000, max_items=30)

    def work(t):
        for i in range(300):
            level.put(_entry(key=f"{t}-{i % 40}", size=100))
            level.get(f"{t}-{(i * 7) % 40}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(level) <= 30 and level.bytes == sum(e.size for e, _ in level._lru._items.values())


# Store levels --------------------------------------------------------------------------------
def _builder(counter, size=1000):
    def build():
        counter.append(1)
        return {"name": "kern", "compile_seconds": 0.25}, {"cubin": b"x" * size}, 0.25
    return build


def test_round_trip_through_memory_and_disk_and_across_store_instances(tmp_path):
    calls = []
    store = Store(Config(dir=tmp_path))
    meta, blobs = store.get_or_create(K1, _builder(calls), label="kern")
    assert calls == [1] and blobs == {"cubin": b"x" * 1000}
    assert store.get(K1)[1] == "memory"
    store.close()
    fresh = Store(Config(dir=tmp_path))
    entry, level = fresh.get(K1)
    assert level == "disk" and entry.blobs == blobs and entry.meta["name"] == "kern"
    assert fresh.get(K1)[1] == "memory"  # promoted
    fresh.get_or_create(K1, _builder(calls))
    assert calls == [1]


def test_a_hit_from_a_slower_level_is_copied_up_as_stored_and_counted_per_level(tmp_path, monkeypatch):
    """The chain as sccache's: memory is read first like any level; a shared hit is kept in the disk
    and memory levels as the bytes it was stored as (never encoded or signed again), and the store
    counts misses, backfills and writes per level."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o2775)
    config = Config(dir=tmp_path / "a", shared_dir=shared, signing_key=b"k" * 32)
    writer = Store(config)
    writer.put(_entry(K))
    stored = writer.level("shared").peek_raw(K)
    writer.close()
    reader = Store(Config(dir=tmp_path / "b", shared_dir=shared, signing_key=b"k" * 32))
    monkeypatch.setattr(reader, "encode", lambda entry: pytest.fail("a backfill encoded the entry again"))
    entry, level = reader.get(K)
    assert level == "shared" and entry.stored == stored
    assert reader.level("disk").peek_raw(K) == stored  # the same bytes, signature and all
    counts = reader.stats.session()["level_counts"]
    assert counts["memory"]["misses"] == 1 and counts["disk"]["misses"] == 1
    assert counts["memory"]["backfills"] == 1 and counts["disk"]["backfills"] == 1 and counts["disk"]["writes"] == 1
    again, level = reader.get(K)
    assert level == "memory" and again.stored is None and again.blobs == entry.blobs  # memory keeps no bytes twice
    assert [(lv.name, lv.location, lv.mode) for lv in reader.levels] == [
        ("memory", "this process", "read-write"), ("disk", str(tmp_path / "b"), "read-write"),
        ("shared", str(shared), "read-write")]
    reader.close()


def test_memory_only_store_without_a_dir():
    calls = []
    store = Store(Config())
    store.get_or_create(K, _builder(calls))
    store.get_or_create(K, _builder(calls))
    assert calls == [1] and store.disk is None


def test_disabled_store_builds_every_time(tmp_path):
    calls = []
    store = Store(Config(dir=tmp_path, disabled=True))
    store.get_or_create(K, _builder(calls))
    store.get_or_create(K, _builder(calls))
    assert calls == [1, 1]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_disk_entry_is_a_miss_removed_and_rebuilt(tmp_path, damage):
    calls = []
    Store(Config(dir=tmp_path)).get_or_create(K, _builder(calls, size=100_000))
    disk = DiskLevel(tmp_path)
    raw = bytearray(disk.peek_raw(K))
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
    else:
        raw = raw[: len(raw) - 10]
    (tmp_path / "entries" / K[:2] / K).write_bytes(bytes(raw))  # damaged in place (a writer checks what it stores)
    store = Store(Config(dir=tmp_path))
    with pytest.warns(kernel_cache.KernelCacheWarning, match="corrupt"):
        meta, blobs = store.get_or_create(K, _builder(calls, size=100_000))
    assert calls == [1, 1] and blobs["cubin"] == b"x" * 100_000
    assert entry_format.decode(DiskLevel(tmp_path).peek_raw(K), expected_key=K).blobs == blobs


def test_threads_missing_the_same_key_build_once(tmp_path):
    calls = []
    store = Store(Config(dir=tmp_path))

    def slow_build():
        calls.append(1)
        time.sleep(0.3)
        return {"name": "kern"}, {"cubin": b"y"}, 0.3

    results = []
    threads = [threading.Thread(target=lambda: results.append(store.get_or_create("5" * 32, slow_build)))
               for _ in range(6)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert calls == [1] and len(results) == 6 and all(r[1] == {"cubin": b"y"} for r in results)


def test_four_processes_missing_the_same_kernel_compile_it_once(tmp_path):
    """Real Triton compiles: 4 interpreters race for the same spec on one cache dir."""
    code = textwrap.dedent("""
        import json, sys
        import compiler, kernel_cache
        from compiler.examples import example_specs
        spec = dict(example_specs("sm_90"))["matmul[0]"]
        art, key = compiler.get_or_compile(spec)
        print(json.dumps({"key": key, "session": kernel_cache.default_store().stats.session(),
                          "cubin": art.cubin.hex()[:64]}))
    """)
    import subprocess
    import sys

    from conftest import ROOT
    env = child_env(KERNEL_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert len({o["key"] for o in outs}) == 1 and len({o["cubin"] for o in outs}) == 1
    assert sum(o["session"]["compiles"] for o in outs) == 1
    assert Store(Config(dir=tmp_path)).stats.totals()["compiles"] == 1


# Stats, config, logging ---------------------------------------------------------------------
def test_stats_persist_across_processes(tmp_path):
    code = textwrap.dedent("""
        import kernel_cache
        store = kernel_cache.default_store()
        build = lambda: ({"name": "k", "compile_seconds": 2.0}, {"b": b"1"}, 2.0)
        store.get_or_create("a1" * 16, build)
        store.get_or_create("a1" * 16, build)
    """)
    env = {"KERNEL_CACHE_DIR": str(tmp_path)}
    run_python(code, env)
    run_python(code, env)
    totals = Store(Config(dir=tmp_path)).stats.totals()
    assert totals["compiles"] == 1 and totals["misses"] == 1
    assert totals["hits"] == {"memory": 2, "disk": 1, "job": 0, "shared": 0, "remote": 0}
    assert totals["compile_seconds"] == pytest.approx(2.0)
    assert totals["compile_seconds_saved"] == pytest.approx(6.0)


def test_config_from_env_and_clear_errors(tmp_path):
    cfg = Config.from_env({"KERNEL_CACHE_DIR": str(tmp_path), "KERNEL_CACHE_MEMORY_BYTES": "64M",
                           "KERNEL_CACHE_MAX_BYTES": "1.5G", "KERNEL_CACHE_DISABLE": "0",
                           "KERNEL_CACHE_LOG": "info"})
    assert cfg.dir == tmp_path and cfg.memory_bytes == 64 << 20 and cfg.max_bytes == int(1.5 * (1 << 30))
    assert Config.from_env({}).dir is None and Config.from_env({"KERNEL_CACHE_DISABLE": "yes"}).disabled
    assert Config.from_env({"KERNEL_CACHE_SOFT_LOCK_STALE": "5m", "KERNEL_CACHE_LOCK_TIMEOUT": "90s"}) \
        .soft_lock_stale == 300 and Config.from_env({"KERNEL_CACHE_LOCK_TIMEOUT": "90s"}).lock_timeout == 90
    with pytest.raises(ConfigError, match="KERNEL_CACHE_LOCK_TIMEOUT: '?90'? has no unit.*ms, s, m, h, d, w"):
        Config.from_env({"KERNEL_CACHE_LOCK_TIMEOUT": "90"})
    for name, value in [("KERNEL_CACHE_MAX_BYTES", "10X"), ("KERNEL_CACHE_MEMORY_BYTES", "lots"),
                        ("KERNEL_CACHE_DISABLE", "maybe"), ("KERNEL_CACHE_LOG", "loud"),
                        ("KERNEL_CACHE_LOCK", "magic"), ("KERNEL_CACHE_SOFT_LOCK_STALE", "soon"),
                        ("KERNEL_CACHE_LOCK_TIMEOUT", "0")]:
        with pytest.raises(ConfigError, match=name):
            Config.from_env({name: value})


def test_log_prints_a_line_per_lookup(tmp_path):
    code = textwrap.dedent("""
        import kernel_cache
        store = kernel_cache.default_store()
        build = lambda: ({"name": "k"}, {"b": b"1"}, 0.1)
        store.get_or_create("0123456789abcdef" * 2, build, label="my_kernel")
        store.get_or_create("0123456789abcdef" * 2, build, label="my_kernel")
    """)
    err = run_python(code, {"KERNEL_CACHE_DIR": str(tmp_path), "KERNEL_CACHE_LOG": "info"}).stderr
    lines = [line for line in err.splitlines() if line.startswith("kernel-cache 0123456789ab")]
    assert len(lines) == 2
    assert "my_kernel" in lines[0] and "compile" in lines[0] and "memory" in lines[1]
    assert lines[1].endswith(" ms  my_kernel")  # key, level, milliseconds, then the label


# Degrade, never break -----------------------------------------------------------------------
def test_uncreatable_dir_degrades_to_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    calls = []
    with pytest.warns(kernel_cache.KernelCacheWarning, match="memory only") as record:
        store = Store(Config(dir=blocker / "cache"))
        Store(Config(dir=blocker / "cache"))
    assert len(record) == 1 and store.disk is None
    store.get_or_create(K, _builder(calls))
    store.get_or_create(K, _builder(calls))
    assert calls == [1]


def test_full_disk_degrades_with_one_warning(tmp_path, monkeypatch):
    store = Store(Config(dir=tmp_path))

    def no_space(self, entry, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DiskLevel, "keep", no_space)
    calls = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for key in ("a" * 32, "b" * 32, "c" * 32):
            meta, blobs = store.get_or_create(key, _builder(calls))
            assert blobs == {"cubin": b"x" * 1000}
    ours = [w for w in record if issubclass(w.category, kernel_cache.KernelCacheWarning)]
    assert len(ours) == 1 and "No space left" in str(ours[0].message)
    assert calls == [1, 1, 1] and store.get("a" * 32)[1] == "memory"


def test_default_store_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_CACHE_DIR", str(tmp_path))
    store = kernel_cache.configure()
    try:
        assert kernel_cache.default_store() is store and store.disk is not None
        assert store.disk.directory == tmp_path
    finally:
        monkeypatch.delenv("KERNEL_CACHE_DIR")
        kernel_cache.configure()


def test_shared_level_takes_its_soft_lock_expiry_from_the_config(tmp_path):
    (tmp_path / "shared").mkdir()
    store = Store(Config(dir=tmp_path / "local", shared_dir=tmp_path / "shared", soft_lock_stale=7.0))
    assert store.shared is not None and store.shared.stale_after == 7.0


def test_a_valid_entry_that_is_not_an_artifact_is_dropped_and_rebuilt(tmp_path, example_specs_sm90):
    import compiler

    spec = example_specs_sm90["add"]
    store = Store(Config(dir=tmp_path))
    key = compiler.content_key(spec)
    store.put(Entry(key=key, meta={"kind": "something-else"}, blobs={"x": b"1"}))
    with pytest.warns(kernel_cache.KernelCacheWarning, match="not a usable kernel artifact"):
        art, got = compiler.get_or_compile(spec, store)
    assert got == key and art.cubin and art.name == "add_kernel"
    assert store.stats.session()["compiles"] == 1
    assert compiler.lookup(spec, store)[0].cubin == art.cubin


def test_metadata_is_read_from_the_head_of_an_entry_without_its_blobs():
    data = entry_format.encode(_entry(created=123.0, size=200_000))
    head = data[:entry_format.META_PEEK_BYTES]
    assert entry_format.peek_meta_head(head, len(data))["created"] == 123.0
    with pytest.raises(CorruptEntry, match="truncated"):
        entry_format.peek_meta_head(head, len(data) - 5)


def test_a_miss_reads_each_level_once(tmp_path, monkeypatch):
    """One read per miss: a lookup that missed hands get_or_create `known_missing`, and under the build
    lock a presence probe (not a read) says whether a neighbour built it meanwhile; only then is it
    read (three reads were one, plus a probe)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    store = Store(Config(dir=tmp_path / "local", shared_dir=shared))
    reads = {"disk": 0, "shared": 0}
    for level in store.persistent_levels:
        real = level.get

        def counted(key, real=real, name=level.name):
            reads[name] += 1
            return real(key)

        monkeypatch.setattr(level, "get", counted)
    build = lambda: ({"name": "k"}, {"cubin": b"x" * 100}, 0.1)  # noqa: E731
    assert store.lookup(K) is None
    store.get_or_create(K, build, known_missing=True)
    assert reads == {"disk": 1, "shared": 1}  # the lookup; under the lock only a probe
    store.get_or_create(K1, build)
    assert reads == {"disk": 2, "shared": 2}  # without the hint: the read before the lock

    # a neighbour (another process: not in this one's memory) publishes while this one waits for
    # the lock: the probe sees it, it is read, and nothing is built here
    neighbour = Store(Config(dir=tmp_path / "local", shared_dir=shared))
    built = []
    real_flight = store._single_flight

    @contextlib.contextmanager
    def publish_first(key, label=""):
        neighbour.put(Entry(key=key, meta={"name": "theirs"}, blobs={"cubin": b"y" * 100}))
        with real_flight(key, label) as unserved:
            yield unserved

    monkeypatch.setattr(store, "_single_flight", publish_first)
    meta, _ = store.get_or_create(K2, lambda: built.append(1) or build(), known_missing=True)
    assert built == [] and meta["name"] == "theirs"
    neighbour.close()
    store.close()
