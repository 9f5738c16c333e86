"""A Redis Cluster's own failures, against real clusters started here (tests/support/redis_cluster.py): a
cluster named by several URLs whose first node is dead or hung, a master SIGKILLed while processes
write, processes started while a master is dead and its replica not yet promoted, and a hostile node
whose slot map is huge. Each failure costs its own node's slots, never the level."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import warnings

import pytest
from conftest import ROOT, child_env
from fake_resp import FakeRedis, slot_map_reply
from redis_cluster import RedisCluster
from redis_server import RedisServer
from test_remote_level import KEYS, SIGNING_KEY, _result, _spawn, remote, signed
from test_shared_level import KEY, make_entry

pytestmark = [pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                                 reason="redis-server and redis-cli are not installed (apt-get install redis-server; "
                                        "scripts/test.sh does it where it runs as root)"),
              pytest.mark.usefixtures("fresh_warnings")]


def _builds(log) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _counts(log, keys) -> dict[str, int]:
    builds = _builds(log)
    return {k: builds.count(k) for k in keys}


def _stored(cluster: RedisCluster, namespace: str) -> set[str]:
    """The keys whose entries the cluster's live masters hold."""
    import redis
    found = set()
    for master in cluster.masters():
        for name in redis.Redis(port=master.port).scan_iter(match=f"kc:{namespace}:v2:e:*"):
            found.add(name.decode().rsplit("{", 1)[1].rstrip("}"))
    return found


@pytest.fixture
def own_cluster(tmp_path):
    c = RedisCluster(tmp_path / "cluster")
    yield c
    c.stop()


# Several seeds ---------------------------------------------------------------------------------------
def test_a_cluster_named_by_two_urls_whose_first_node_is_dead_serves_every_process(own_cluster, tmp_path):
    (tmp_path / "dead").mkdir()
    dead = RedisServer(tmp_path / "dead")
    dead.kill()  # its port answers nothing now: the named node is down
    urls = f"{dead.url},{own_cluster.nodes[2].url}"
    log = tmp_path / "builds.log"
    keys = KEYS[:14]
    first = [_result(p) for p in [_spawn(urls, "seeds", tmp_path / f"a{i}", keys, log, delay=0.05) for i in range(4)]]
    assert all(r["served"] for r in first)
    assert sorted(_builds(log)) == sorted(keys)  # each key compiled once between the four
    second = [_result(_spawn(urls, "seeds", tmp_path / f"b{i}", keys, log)) for i in range(4)]
    assert all(r["stats"]["compiles"] == 0 and r["stats"]["hits"].get("remote") == 14 for r in second)


def test_a_hung_seed_costs_one_timeout_once_per_process(own_cluster):
    with FakeRedis("hang") as hung:
        level = remote(f"{hung.url},{own_cluster.url}", namespace="hung", timeout=0.3)
        level.put_raw(KEY, signed(make_entry(KEY)))  # the hung seed is asked first: one timeout
        start = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(20):
                assert level.get(KEY) is not None
        assert time.monotonic() - start < 0.5  # the twenty reads pay nothing for the hung seed
        assert level.counters["timeouts"] == 1 and level.link.cluster is True


# A master lost ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_master_killed_while_processes_write_costs_at_most_two_compiles_a_key(tmp_path):
    """The dead master's keys go to a stand-in node until its replica is promoted (node timeout 8 s: after
    the run, so no CLUSTERDOWN window, where each process compiles alone, falls inside it); what the
    failover lost is compiled at most once after it."""
    cluster = RedisCluster(tmp_path / "cluster", node_timeout_ms=8000)
    try:
        log = tmp_path / "builds.log"
        keys = KEYS[:40]
        procs = [_spawn(cluster.url, "kill", tmp_path / f"n{i}", keys, log, delay=0.1) for i in range(4)]
        start = time.monotonic()
        deadline = time.monotonic() + 60
        while len(_builds(log)) < 5 and time.monotonic() < deadline:  # mid-run: the fleet is warming
            time.sleep(0.02)
        victim = next(m for m in cluster.masters() if m is not cluster.nodes[0])
        victim.kill()
        results = [_result(p, timeout=180) for p in procs]
        assert all(r["served"] for r in results)
        assert time.monotonic() - start < 60  # nobody waited out the children's lock timeout (120 s)
        counts = _counts(log, keys)
        assert set(_builds(log)) == set(keys) and max(counts.values()) <= 2, counts
        cluster.wait_ok()
        lost = set(keys) - _stored(cluster, "kill")  # on the stand-in, or not yet replicated
        log.write_text("")
        after = [_result(_spawn(cluster.url, "kill", tmp_path / f"m{i}", keys, log)) for i in range(4)]
        assert all(r["served"] for r in after)
        rebuilt = _builds(log)  # what the failover lost, at most once (a process whose map still names the
        assert set(rebuilt) <= lost and len(rebuilt) == len(set(rebuilt)), (rebuilt, lost)  # dead node: stand-in)
    finally:
        cluster.stop()


@pytest.mark.slow
def test_processes_started_while_a_master_is_dead_never_wait_for_its_failover(own_cluster, tmp_path):
    """Its keys go to a stand-in node until the replica is promoted; while the whole cluster says
    CLUSTERDOWN (between the master marked failed and the promotion) each compiles alone; once whole
    again, every key is compiled once between them."""
    victim = next(m for m in own_cluster.masters() if m is not own_cluster.nodes[0])
    victim.kill()  # dead, its replica promoted only after the node timeout (1 s)
    log = tmp_path / "builds.log"
    keys = KEYS[:40]  # 0.2 s builds: 8 s a process, most of it after the failover
    procs = [subprocess.Popen([sys.executable, "-c", WITH_WARNINGS, own_cluster.url, str(tmp_path / f"n{i}"),
                               ",".join(keys), str(log)], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(6)]
    own_cluster.wait_ok()
    whole = time.time()
    results = [_result(p, timeout=180) for p in procs]
    assert all(r["served"] for r in results)
    assert all(r["seconds"] < len(keys) * 0.2 + 3 for r in results), [r["seconds"] for r in results]  # no waits
    builds = [line.split() for line in log.read_text().splitlines()]
    after = [key for key, at in builds if float(at) > whole + 0.5]  # the slot map read again meanwhile
    assert len(after) >= 10 and all(after.count(key) == 1 for key in after), builds
    for r in results:  # one warning per cause: the dead node, the cluster down
        assert len(r["warnings"]) <= 2 and not any("waited" in w for w in r["warnings"]), r["warnings"]
    assert all(r["stats"]["hits"].get("remote", 0) + r["stats"]["compiles"] == len(keys) for r in results)


WITH_WARNINGS = """
import json, sys, time, warnings
from kernel_cache import Config, Store
url, local, keys, log = sys.argv[1:5]
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    store = Store(Config(dir=local, remote=url, remote_namespace="dead", remote_timeout=0.5, lock_timeout=120,
                         signing_key=SIGNING))
    served = []
    start = time.monotonic()
    for key in keys.split(","):
        def build(key=key):
            with open(log, "a") as f:
                f.write(f"{key} {time.time()}\\n")
            time.sleep(0.2)
            return {"kernel": "synthetic"}, {"cubin": key.encode() * 64}, 0.01
        meta, blobs = store.get_or_create(key, build)
        served.append(blobs["cubin"] == key.encode() * 64)
print(json.dumps({"served": all(served), "stats": store.stats.session(), "seconds": time.monotonic() - start,
                  "warnings": [str(w.message) for w in caught if "remote cache" in str(w.message)]}))
""".replace("SIGNING", repr(SIGNING_KEY))


# A hostile node ---------------------------------------------------------------------------------------
SLOT_MAP_CHILD = """
import json, resource, sys, time, warnings
from kernel_cache.levels.remote.level import RemoteLevel
from kernel_cache.trust.signing import Signer
caught = warnings.catch_warnings(record=True).__enter__()
warnings.simplefilter("always")
level = RemoteLevel(sys.argv[1], namespace="big", timeout=float(sys.argv[2]), signer=Signer(b"k" * 32))
level.link  # noqa: redis-py imported, nothing asked yet: the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
got = level.get("0" * 32)
first = time.monotonic() - start
start = time.monotonic()
again = level.get("0" * 32)
print(json.dumps({"got": got is not None, "first": first, "again": time.monotonic() - start,
                  "rss_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
                  "counters": level.counters, "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.parametrize("primaries,replicas,refused", [(16384, 0, "names more than 1000 nodes"),
                                                       (16384, 1, "names more than 1000 nodes"),
                                                       (65536, 1, "sent a reply over 3145728 bytes")],
                         ids=["16384-primaries", "with-replicas", "11-MiB"])
def test_a_hostile_slot_map_costs_one_timeout_and_little_memory(primaries, replicas, refused):
    timeout = 1.0
    reply = slot_map_reply(primaries, replicas)
    says_cluster = b"$19\r\ncluster_enabled:1\r\n\r\n"  # INFO cluster, for a client that asks it first
    with FakeRedis("reply", replies={b"CLUSTER": reply, b"INFO": says_cluster, b"COMMAND": b"*0\r\n"}) as fake:
        out = subprocess.run([sys.executable, "-c", SLOT_MAP_CHILD, fake.url, str(timeout)], cwd=ROOT,
                             env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert not r["got"] and r["counters"]["breaker_openings"] == 1  # the node's fault, said once
    assert r["first"] < timeout + 0.5 and r["again"] < 0.05
    assert r["rss_mib"] < 100, r
    [said] = r["warnings"]
    assert refused in said, said


# Seeds and slot maps, without a server ----------------------------------------------------------------
def test_a_host_name_is_a_seed_per_address_and_tls_keeps_its_name():
    from kernel_cache.levels.remote.redis_seeds import seeds
    from kernel_cache.settings.remote_url import split_urls

    urls = split_urls("redis://kc:pw@localhost:7001/0, rediss://kc:p,w@cache.example:7002/0,unix:///run/r.sock")
    assert urls == ["redis://kc:pw@localhost:7001/0", "rediss://kc:p,w@cache.example:7002/0", "unix:///run/r.sock"]
    found = seeds(urls)
    assert "redis://kc:pw@127.0.0.1:7001/0" in found  # every address of the name, credentials kept
    assert all("localhost" not in s for s in found)
    assert found[-2:] == urls[1:]  # the certificate names the host; a socket is a path


def test_a_slot_map_is_read_within_its_bounds():
    from kernel_cache.levels.remote.redis_slots import BadSlotMap, parse

    reply = [[0, 8191, [b"", 7001, b"id1"], [b"10.0.0.2", 7002, b"id2"]], [8192, 16383, [b"10.0.0.3", 7003]]]
    slot_map = parse(reply, "10.0.0.1")
    assert slot_map.owners[0] == "10.0.0.1:7001" and slot_map.owners[16383] == "10.0.0.3:7003"
    assert slot_map.primaries == ["10.0.0.1:7001", "10.0.0.3:7003"]
    assert slot_map.replicas["10.0.0.1:7001"] == ["10.0.0.2:7002"]
    assert slot_map.moved(5, "10.0.0.9:7009").owners[5] == "10.0.0.9:7009"
    for bad in ([[0, 16384, [b"h", 1]]], [[5, 1, [b"h", 1]]], [[0, 1, [b"h", 0]]], [[0, 1, [b"h/x", 1]]],
                [[0, 1, b"h"]], "not a list", [[i, i, [b"h", 1 + i]] for i in range(1001)]):
        with pytest.raises(BadSlotMap):
            parse(bad, "h")
