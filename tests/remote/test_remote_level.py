"""The Redis remote level against a real redis-server (tests/support/redis_server.py): entries shared across
processes with separate local dirs, one compile per key across many processes, a holder killed
mid-compile, a server killed, hung and restarted mid-run (every call served, bounded time), forged,
unsigned and replayed entries refused, eviction under a tiny maxmemory. Skipped where redis-server
cannot be had (scripts/test.sh and .ci/run install it as root)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import warnings

import pytest
from conftest import ROOT, child_env
from redis_server import RedisServer
from test_shared_level import KEY, KEY2, Builder, make_entry

from kernel_cache import Config, ConfigError, Store
from kernel_cache.entries import entry as entry_format
from kernel_cache.entries.entry import CorruptEntry
from kernel_cache.errors import LevelUntrusted, RejectedEntry
from kernel_cache.levels.remote.level import RemoteLevel, open_from_config
from kernel_cache.settings.remote_url import redacted
from kernel_cache.trust.signing import Signer

pytestmark = [pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server is not installed (apt-get install redis-server; scripts/test.sh "
                                        "does it where it runs as root)"),
              pytest.mark.usefixtures("fresh_warnings")]
SIGNING_KEY = b"remote-team-signing-key-0123456789"
KEYS = [f"{i:032x}" for i in range(1, 41)]


@pytest.fixture
def fresh_server(tmp_path):
    """A server of the test's own, for the tests that kill, pause or reconfigure it."""
    workdir = tmp_path / "redis"
    workdir.mkdir()
    srv = RedisServer(workdir)
    yield srv
    srv.stop()


def signed(entry, key=SIGNING_KEY) -> bytes:
    return Signer(key).sign(entry_format.encode(entry))


def remote(url, namespace="t", *, lease_ms=None, breaker_seconds=None, **kw) -> RemoteLevel:
    """A signed level; `lease_ms` and `breaker_seconds`, where given, pace it (set before its first call)."""
    level = RemoteLevel(url, namespace=namespace, signer=Signer(SIGNING_KEY), **kw)
    if lease_ms is not None:
        level.lease_ms = lease_ms
    if breaker_seconds is not None:
        level.breaker_seconds = breaker_seconds
    return level


def plain(level: RemoteLevel):
    """redis-py's client for the level's one server: what a neighbour, or an attacker, writes there."""
    return level.link.client_for(level.link.primaries()[0])


# The level itself -------------------------------------------------------------------------------
def test_an_entry_round_trips_and_a_hit_restarts_its_ttl(server):
    level = remote(server.url, namespace="roundtrip", ttl=1000)
    data = signed(make_entry(KEY))
    level.put_raw(KEY, data)
    assert KEY in level and KEY2 not in level
    plain(level).expire(level._entry(KEY), 10)
    assert level.get(KEY).blobs == make_entry(KEY).blobs
    assert plain(level).ttl(level._entry(KEY)) <= 10  # a read stays a read: the refresh waits for a batch
    level.flush_touches()  # at the next write, TOUCH_BATCH hits, close or exit
    assert plain(level).ttl(level._entry(KEY)) > 900  # the hit restarted it
    assert level.get(KEY2) is None and level.counters["hits"] == 1 and level.counters["misses"] == 1
    [record] = level.listing()
    assert record["key"] == KEY and record["size_bytes"] == len(data)
    assert level.delete(KEY) and KEY not in level


def test_a_unix_socket_url_works_and_the_password_never_shows(server):
    level = remote(server.unix_url, namespace="unix")
    level.put_raw(KEY, signed(make_entry(KEY)))
    assert level.get(KEY) is not None
    assert redacted("redis://kc:s3cret@host:6379/2") == "redis://kc:***@host:6379/2"
    with pytest.raises(ConfigError, match=r"http://u:\*\*\*@h/0.: no Redis URL"):
        Config(remote="http://u:secret@h/0")


def test_unsigned_forged_and_replayed_entries_are_refused(server):
    level = remote(server.url, namespace="forged")
    plain(level).set(level._entry(KEY), entry_format.encode(make_entry(KEY)))  # unsigned
    with pytest.raises(RejectedEntry, match="remote entry"):
        level.get(KEY)
    plain(level).set(level._entry(KEY), signed(make_entry(KEY), b"another-key-0123456789abcdef"))  # forged
    with pytest.raises(RejectedEntry):
        level.get(KEY)
    assert level.counters["rejected"] == 2
    plain(level).set(level._entry(KEY2), signed(make_entry(KEY)))  # a real entry replayed under another key
    with pytest.raises(CorruptEntry):
        level.get(KEY2)
    assert plain(level).exists(level._entry(KEY2)) == 0  # a damaged entry is deleted where found
    store = Store(Config(dir=None, remote=server.url, remote_namespace="forged", signing_key=SIGNING_KEY))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        meta, _ = store.get_or_create(KEY, Builder(KEY))  # rebuilt here, never copied from the forgery
    assert store.stats.session()["rejected"] >= 1  # counted per read (the store reads again under the lock)


def test_without_a_signing_key_the_remote_needs_an_explicit_opt_in(server):
    from kernel_cache.trust.safefs import Owners
    with pytest.raises(LevelUntrusted, match="KERNEL_CACHE_REMOTE_UNSIGNED=1"):
        open_from_config(Config(remote=server.url), Owners.current(), None, False)
    level = open_from_config(Config(remote=server.url, remote_unsigned=True), Owners.current(), None, False)
    assert level is not None and level.signer is None


def test_entries_over_the_size_cap_are_neither_written_nor_read(server):
    level = remote(server.url, namespace="cap", max_entry_bytes=1 << 16)
    level.put_raw(KEY, signed(make_entry(KEY, size=100_000)))
    assert KEY not in level and level.counters["too_large"] == 1


def test_a_tiny_maxmemory_evicts_and_evicted_entries_are_misses(fresh_server):
    fresh_server.kill()
    srv = RedisServer(fresh_server.workdir, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
    try:
        level = remote(srv.url, namespace="evict")
        for key in KEYS:
            level.put_raw(key, signed(make_entry(key, size=200_000)))
        present = [k for k in KEYS if k in level]
        assert 0 < len(present) < len(KEYS)  # the oldest went
        store = Store(Config(remote=srv.url, remote_namespace="evict", signing_key=SIGNING_KEY))
        missing = next(k for k in KEYS if k not in present)
        builder = Builder(missing)
        store.get_or_create(missing, builder)
        assert builder.calls == 1
        assert level.describe()["maxmemory_policy"] == "allkeys-lru"
    finally:
        srv.stop()


# Faults: the server dead, hung, back --------------------------------------------------------------
def test_a_dead_server_costs_one_timeout_then_nothing(tmp_path):
    level = remote("redis://127.0.0.1:9/0", namespace="dead", timeout=0.2)  # discard port: refused at once
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert level.get(KEY) is None
        for _ in range(50):
            assert level.get(KEY) is None and KEY not in level
            level.put_raw(KEY, signed(make_entry(KEY)))
    assert time.monotonic() - start < 1.0
    assert level.counters["breaker_openings"] == 1 and not level.link.available  # skipped (1 s, then longer)
    assert len([w for w in caught if "remote cache" in str(w.message)]) == 1


def test_a_hung_server_never_blocks_a_compile_beyond_its_timeout(fresh_server, tmp_path):
    store = Store(Config(dir=tmp_path / "local", remote=fresh_server.url, remote_namespace="hung",
                         remote_timeout=0.3, signing_key=SIGNING_KEY, lock_timeout=5))
    fresh_server.pause()
    try:
        start = time.monotonic()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for key in KEYS[:5]:
                store.get_or_create(key, Builder(key))
        assert time.monotonic() - start < 3.0  # one read timeout, then the breaker skips the server
        assert store.level("remote").counters["timeouts"] >= 1
    finally:
        fresh_server.resume()
    assert all(store.get(key) is not None for key in KEYS[:5])  # nothing lost locally


# Across processes ---------------------------------------------------------------------------------
CHILD = """
import json, sys, time
from kernel_cache import Config, Store
url, namespace, local, keys, delay, log = sys.argv[1:7]
store = Store(Config(dir=local, remote=url, remote_namespace=namespace, remote_timeout=0.5, lock_timeout=120,
                     signing_key=SIGNING))
def builder(key):
    def build():
        with open(log, "a") as f:
            f.write(key + "\\n")
        time.sleep(float(delay))
        return {"kernel": "synthetic"}, {"cubin": key.encode() * 64}, 0.01
    return build
served = []
for key in keys.split(","):
    meta, blobs = store.get_or_create(key, builder(key))
    served.append(blobs["cubin"] == key.encode() * 64)
print(json.dumps({"served": all(served), "stats": store.stats.session()}))
""".replace("SIGNING", repr(SIGNING_KEY))


def _spawn(url, namespace, local, keys, log, delay=0.0):
    return subprocess.Popen([sys.executable, "-c", CHILD, url, namespace, str(local), ",".join(keys), str(delay),
                             str(log)], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _result(proc, timeout=120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_second_process_on_another_local_dir_compiles_nothing(server, tmp_path):
    log = tmp_path / "builds.log"
    first = _result(_spawn(server.url, "share", tmp_path / "node1", KEYS[:10], log))
    second = _result(_spawn(server.url, "share", tmp_path / "node2", KEYS[:10], log))
    assert first["served"] and second["served"]
    assert first["stats"]["compiles"] == 10 and second["stats"]["compiles"] == 0
    assert second["stats"]["hits"].get("remote") == 10


@pytest.mark.slow
def test_many_processes_compile_each_key_once(server, tmp_path):
    log = tmp_path / "builds.log"
    procs = [_spawn(server.url, "flight", tmp_path / f"node{i}", KEYS[:12], log, delay=0.05) for i in range(6)]
    results = [_result(p) for p in procs]
    assert all(r["served"] for r in results)
    assert sorted(log.read_text().split()) == sorted(KEYS[:12])  # every key built exactly once


@pytest.mark.slow
def test_a_holder_killed_mid_compile_frees_the_key_when_its_lease_lapses(server, tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from kernel_cache.trust.signing import Signer
from kernel_cache.levels.remote.level import RemoteLevel
level = RemoteLevel({server.url!r}, namespace="lease", signer=Signer({SIGNING_KEY!r}))
level.lease_ms = 1500
with level.lock({KEY!r}, 10) as held:
    print(held, flush=True)
    time.sleep(60)
"""], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "True"
    holder.kill()
    holder.wait()
    waiter = remote(server.url, namespace="lease", lease_ms=1500)
    start = time.monotonic()
    with waiter.lock(KEY, 20) as held:
        assert held
    assert time.monotonic() - start < 5  # the lease lapsed (1.5 s), not the wait bound (20 s)
    assert waiter.counters["lock_waits"] == 1


@pytest.mark.slow
def test_the_server_killed_and_restarted_mid_run_never_fails_a_call(fresh_server, tmp_path):
    log = tmp_path / "builds.log"
    procs = [_spawn(fresh_server.url, "chaos", tmp_path / f"node{i}", KEYS, log, delay=0.02) for i in range(3)]
    time.sleep(0.4)
    fresh_server.kill()
    time.sleep(0.5)
    fresh_server.start()
    start = time.monotonic()
    results = [_result(p, timeout=120) for p in procs]
    assert all(r["served"] for r in results)  # every call served: from Redis, the local dir, or compiled
    assert time.monotonic() - start < 60
    builds = log.read_text().split()
    assert set(builds) == set(KEYS) and len(builds) <= 3 * len(KEYS)


LAZY_PROBE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from kernel_cache import Config, Store
directory, url, key, other = sys.argv[1:5]
signing = b"remote-team-signing-key-0123456789"
Store(Config(dir=directory, signing_key=signing)).get_or_create(key, lambda: ({"k": 1}, {"cubin": b"x"}, 0.01))
store = Store(Config(dir=directory, remote=url, remote_timeout=0.2, signing_key=signing))
hit = store.get(key)
report = {"hit": hit is not None, "redis_after_hit": "redis" in sys.modules}
store.get(other)  # a miss reaches the remote (refused here: nothing listens)
report["redis_after_miss"] = "redis" in sys.modules
print(json.dumps(report))
"""


def test_a_warm_node_whose_disk_serves_every_read_never_imports_redis(tmp_path):
    """The remote level connects (and imports redis-py, ~0.15-0.2 s) at its first use, not when the
    store opens: a warm node with a remote configured reads everything from its own disk."""
    proc = subprocess.run([sys.executable, "-c", LAZY_PROBE, str(tmp_path / "cache"), "redis://127.0.0.1:9/0",
                           KEY, KEY2], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"hit": True, "redis_after_hit": False, "redis_after_miss": True}
