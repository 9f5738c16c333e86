"""The remote level scaled out, against real servers started here (tests/support/redis_cluster.py):
a 3-master + 3-replica Redis Cluster named by any node, a master killed mid-run, a read-only replica of
a filled primary, and a server that comes back after an outage."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import time
import warnings

import pytest
from conftest import ROOT, child_env
from redis_cluster import PrimaryWithReplica, RedisCluster
from redis_server import RedisServer
from test_remote_level import KEYS, SIGNING_KEY, _result, _spawn, remote, signed
from test_shared_level import KEY, Builder, make_entry

from kernel_cache import Config, Store

pytestmark = [pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                                 reason="redis-server and redis-cli are not installed (apt-get install redis-server; "
                                        "scripts/test.sh does it where it runs as root)"),
              pytest.mark.usefixtures("fresh_warnings")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = RedisCluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


def _builds(log) -> list[str]:
    return log.read_text().split() if log.exists() else []


# 1. A Redis Cluster ---------------------------------------------------------------------------------
def test_a_cluster_named_by_any_node_compiles_each_key_once_across_processes(cluster, tmp_path):
    log = tmp_path / "builds.log"
    keys = KEYS[:14]
    url = cluster.nodes[1].url  # any node will do, a replica's included
    first = [_spawn(url, "fleet", tmp_path / f"a{i}", keys, log, delay=0.05) for i in range(4)]
    assert all(r["served"] for r in map(_result, first))
    assert sorted(_builds(log)) == sorted(keys)  # each key built once between the four
    second = [_result(_spawn(url, "fleet", tmp_path / f"b{i}", keys, log)) for i in range(4)]
    assert all(r["served"] and r["stats"]["compiles"] == 0 and r["stats"]["hits"].get("remote") == 14
               for r in second)
    level = remote(url, namespace="fleet")
    assert level.get(KEY) is None and level.link.cluster is True
    # the entries are spread over the masters, each beside its lease's slot
    holding = [m for m in cluster.masters() if _dbsize(m) > 0]
    assert len(holding) >= 2
    from redis.crc import key_slot
    assert key_slot(level._entry(KEY).encode()) == key_slot(level._name("l:", KEY).encode())
    assert level.link.group([level._entry(KEY), level._name("l:", KEY)]).keys() == {level.link._owner(level._entry(KEY))}


def _dbsize(server: RedisServer) -> int:
    import redis
    return int(redis.Redis(port=server.port).dbsize())


def test_cachectl_lists_verifies_and_clears_every_master(cluster, tmp_path):
    level = remote(cluster.url, namespace="ops")
    for key in KEYS[:12]:
        level.put_raw(key, signed(make_entry(key)))
    key_file = tmp_path / "key"
    key_file.write_bytes(SIGNING_KEY)
    key_file.chmod(0o600)
    env = child_env(KERNEL_CACHE_SIGNING_KEY_FILE=str(key_file), KERNEL_CACHE_REMOTE_NAMESPACE="ops")
    env.pop("KERNEL_CACHE_DIR", None)

    def cachectl(*args):
        return subprocess.run([sys.executable, "-m", "kernel_cache", *args, "--remote", cluster.url, "--level",
                               "remote"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    listed = cachectl("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {e["key"] for e in json.loads(listed.stdout)["entries"]} == set(KEYS[:12])
    verified = cachectl("verify")
    assert verified.returncode == 0 and "checked 12 entries: 0 bad" in verified.stdout, verified
    stats = subprocess.run([sys.executable, "-m", "kernel_cache", "stats", "--json", "--remote", cluster.url],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    report = json.loads(stats.stdout)
    assert report["remote"]["cluster"] and report["remote"]["masters"] == 3, stats.stderr
    assert report["levels"]["remote"]["entries"] == 12
    cleared = cachectl("clear", "--yes")
    assert cleared.returncode == 0 and "removed 12 entries" in cleared.stdout, cleared
    import redis
    assert all(not list(redis.Redis(port=m.port).scan_iter(match="kc:ops:*")) for m in cluster.masters())


# 3. Read replicas -------------------------------------------------------------------------------------
def test_a_read_only_replica_serves_every_kernel_with_one_warning_at_most(tmp_path):
    servers = PrimaryWithReplica(tmp_path / "replication")
    try:
        primary = Store(Config(dir=None, remote=servers.primary.url, remote_namespace="replica",
                               signing_key=SIGNING_KEY))
        for key in KEYS[:14]:
            primary.get_or_create(key, Builder(key))
        servers.wait_synced()
        store = Store(Config(dir=tmp_path / "node", remote=servers.replica.url, remote_namespace="replica",
                             signing_key=SIGNING_KEY))
        gc.collect()  # an earlier test's unclosed connection warns when collected (Python 3.13): not in here
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            builders = [Builder(key) for key in KEYS[:14]]
            for key, builder in zip(KEYS[:14], builders, strict=True):
                store.get_or_create(key, builder)
            store.level("remote").flush_touches()  # the refreshes a replica refuses
            fresh = Builder(KEYS[20])
            store.get_or_create(KEYS[20], fresh)  # a miss: built here, not written there
            store.level("remote").flush_touches()
        assert sum(b.calls for b in builders) == 0 and fresh.calls == 1
        assert store.stats.session()["hits"]["remote"] == 14
        level = store.level("remote")
        assert level.link.read_only and level.counters["breaker_openings"] == 0
        said = [str(w.message) for w in caught]
        assert len(said) <= 1 and all("read-only replica" in s for s in said), said
        assert store.get(KEYS[0]) is not None  # reads go on
    finally:
        servers.stop()


# 4. Coming back ---------------------------------------------------------------------------------------
def test_a_restarted_server_is_used_again_within_seconds(tmp_path):
    server = RedisServer(tmp_path)
    try:
        level = remote(server.url, namespace="back", timeout=0.2)
        level.put_raw(KEY, signed(make_entry(KEY)))
        server.kill()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert level.get(KEY) is None  # the fault: skipped, probed 1 s later
            time.sleep(1.3)
            assert level.get(KEY) is None and not level.link.available  # the probe failed: 2 s more
            assert level.counters["breaker_openings"] == 1  # the second read paid nothing
            server.start()
            deadline = time.monotonic() + 4
            while not level.link.available and time.monotonic() < deadline:
                time.sleep(0.05)  # the next probe, 2 s after the failed one, finds it
            level.put_raw(KEY, signed(make_entry(KEY)))  # the server lost its data (no persistence)
            assert level.get(KEY) is not None and level.writable
        assert level.counters["breaker_openings"] == 1
        server.kill()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            level.get(KEY)
        assert level.link.health(level.link.seeds[0]).open_until - time.monotonic() <= 1.0  # one success reset the backoff
    finally:
        server.stop()
