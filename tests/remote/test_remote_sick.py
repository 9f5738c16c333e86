"""A remote that is up but sick never costs more than no remote: each fault (a Redis Cluster that
lost a shard, a full server, one paused for writes, a refused port, a master stopped under a long
node timeout, nodes that redirect in loops) is run beside the same process with no remote, in the
same test, against real servers (or a fake node for the redirects). Each finishes within 1.5x of no
remote + 3 s, compiles each kernel once and says each fault once; none waits for a lease nobody holds."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
import warnings

import pytest
import redis
from conftest import ROOT, child_env
from fake_resp import FakeRedis
from redis_cluster import RedisCluster
from redis_server import RedisServer, free_port
from test_remote_level import KEYS, SIGNING_KEY, make_entry, remote, signed

pytestmark = [pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                                 reason="redis-server and redis-cli are not installed (apt-get install redis-server; "
                                        "scripts/test.sh does it where it runs as root)")]

KERNELS = KEYS[:14]  # as many as the example programs have
BUILD_SECONDS = 0.1

CHILD = """
import json, sys, time, warnings
url, local, keys, log, build_seconds = sys.argv[1:6]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from kernel_cache import Config, Store
    store = Store(Config(dir=local, remote=url or None, remote_namespace="sick", remote_timeout=0.25,
                         signing_key=SIGNING))  # the default lock timeout (600 s): a wrong wait shows
    start = time.monotonic()
    for key in keys.split(","):
        def build(key=key):
            with open(log, "a") as f:
                f.write(key + "\\n")
            time.sleep(float(build_seconds))
            return {"kernel": "synthetic"}, {"cubin": key.encode() * 64}, 0.01
        meta, blobs = store.get_or_create(key, build)
        assert blobs["cubin"] == key.encode() * 64
    seconds = time.monotonic() - start
print(json.dumps({"seconds": seconds, "stats": store.stats.session(),
                  "warnings": [str(w.message) for w in caught]}))
""".replace("SIGNING", repr(SIGNING_KEY))


def run(url: str, tmp_path, name: str, keys=KERNELS, timeout: float = 120) -> dict:
    """One process lowering `keys` (synthetic builds) from an empty local dir; its report and builds."""
    log = tmp_path / f"{name}.builds"
    proc = subprocess.run([sys.executable, "-c", CHILD, url, str(tmp_path / name), ",".join(keys), str(log),
                           str(BUILD_SECONDS)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["builds"] = log.read_text().split() if log.exists() else []
    return report


def assert_no_worse(sick: dict, alone: dict, keys=KERNELS, served: int = 0) -> None:
    """Within 1.5x of no remote + 3 s; each kernel built once; `served` read from the remote."""
    assert sick["seconds"] <= 1.5 * alone["seconds"] + 3, (sick["seconds"], alone["seconds"], sick["warnings"])
    assert sorted(sick["builds"]) == sorted(set(sick["builds"])), sick["builds"]
    assert sick["stats"]["compiles"] == len(keys) - served and sick["stats"]["hits"].get("remote", 0) == served
    assert not any("waited" in w for w in sick["warnings"]), sick["warnings"]


def warm(url: str, tmp_path, keys) -> None:
    """Entries for `keys` on the server, written by a process of their own."""
    report = run(url, tmp_path, "warm", keys)
    assert report["stats"]["compiles"] == len(keys)


def redis_cli(port: int, *words: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *words], capture_output=True, text=True,
                          timeout=10).stdout.strip()


@pytest.fixture
def one_server(tmp_path):
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


# One server -------------------------------------------------------------------------------------------
def test_a_full_server_serves_reads_and_skips_writes_with_one_warning(one_server, tmp_path):
    alone = run("", tmp_path, "alone")
    warm(one_server.url, tmp_path, KERNELS[:7])
    assert redis_cli(one_server.port, "config", "set", "maxmemory", "1") == "OK"  # noeviction: every write refused
    sick = run(one_server.url, tmp_path, "sick")
    assert_no_worse(sick, alone, served=7)
    [said] = sick["warnings"]
    assert "OOM" in said and "maxmemory-policy allkeys-lru" in said, said


def test_a_server_paused_for_writes_serves_reads_and_skips_writes_with_one_warning(one_server, tmp_path):
    alone = run("", tmp_path, "alone")
    warm(one_server.url, tmp_path, KERNELS[:7])
    assert redis_cli(one_server.port, "client", "pause", "20000", "write") == "OK"
    sick = run(one_server.url, tmp_path, "sick")
    assert_no_worse(sick, alone, served=7)
    [said] = sick["warnings"]
    assert "CLIENT PAUSE WRITE" in said, said


def test_each_cause_of_refused_writes_is_said_once_with_its_own_fix():
    """A server that fills up (OOM), then cannot persist (MISCONF): two causes, two warnings, each with its fix."""
    refusals = iter([b"-OOM command not allowed when used memory > 'maxmemory'\r\n",
                     b"-MISCONF Redis is configured to save RDB snapshots, but it is unable to persist\r\n"])
    with FakeRedis("reply", replies={b"SET": lambda: next(refusals, b"+OK\r\n"),
                                     b"CLUSTER": b"-ERR This instance has cluster support disabled\r\n"}) as fake:
        level = remote(fake.url, namespace="causes")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for key in KERNELS[:2]:
                level.put_raw(key, signed(make_entry(key)))
                for health in level.link._health.values():  # the refusal's pause ended: writes are sent again
                    health.writes_open_until = 0.0
    said = [str(w.message) for w in caught]
    assert len(said) == 2, said
    assert "OOM" in said[0] and "maxmemory-policy allkeys-lru" in said[0], said
    assert "MISCONF" in said[1] and "stop-writes-on-bgsave-error" in said[1], said


def test_a_refused_port_costs_nothing_but_one_warning(tmp_path):
    (tmp_path / "gone").mkdir()
    gone = RedisServer(tmp_path / "gone")
    gone.kill()
    alone = run("", tmp_path, "alone")
    sick = run(gone.url, tmp_path, "sick")
    assert_no_worse(sick, alone)
    [said] = sick["warnings"]
    assert "refused" in said.lower(), said


# A Redis Cluster --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_cluster_that_lost_a_shard_costs_one_warning_not_the_lock_timeout(tmp_path):
    cluster = RedisCluster(tmp_path / "cluster", node_timeout_ms=1000)
    try:
        victim = next(m for m in cluster.masters() if m is not cluster.nodes[0])
        for node in [victim, *cluster.replicas_of(victim)]:
            node.kill()
        cluster.wait_state("fail")  # every live node answers CLUSTERDOWN, for good
        alone = run("", tmp_path, "alone")
        sick = run(cluster.url, tmp_path, "sick")
    finally:
        cluster.stop()
    assert_no_worse(sick, alone)
    [said] = sick["warnings"]
    assert "CLUSTERDOWN" in said, said


@pytest.mark.slow
def test_a_master_stopped_under_a_long_node_timeout_costs_one_timeout(tmp_path):
    cluster = RedisCluster(tmp_path / "cluster", node_timeout_ms=15000)  # Redis's default
    try:
        victim = next(m for m in cluster.masters() if m is not cluster.nodes[0])
        victim.pause()  # SIGSTOP: its connections hang, and nobody promotes its replica for 15 s
        alone = run("", tmp_path, "alone")
        sick = run(cluster.url, tmp_path, "sick")
        stand_ins = sum(len(list(redis.Redis(port=m.port).scan_iter(match="kc:sick:v2:fe:*")))
                        for m in cluster.nodes if m is not victim and "role:master" in redis_cli(m.port, "info", "replication"))
        stopped_slots = {slot for start, end, *_ in redis.Redis(port=cluster.nodes[0].port).execute_command("CLUSTER SLOTS")
                         for slot in range(start, end + 1)} - slots_served_by_others(cluster, victim)
    finally:
        cluster.stop()
    assert_no_worse(sick, alone)
    assert stand_ins == sum(1 for key in KERNELS if cluster_slot_of(key) in stopped_slots) > 0  # its keys went there
    [said] = sick["warnings"]
    assert "timed out" in said and "stand-in" in said, said


@pytest.mark.slow
def test_four_processes_through_a_failover_under_a_long_node_timeout_compile_about_once(tmp_path):
    cluster = RedisCluster(tmp_path / "cluster", node_timeout_ms=15000)
    log = tmp_path / "fleet.builds"
    keys = KERNELS
    try:
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, cluster.url, str(tmp_path / f"n{i}"), ",".join(keys),
                                   str(log), "0.4"], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(4)]
        deadline = time.monotonic() + 60
        while len(log.read_text().split() if log.exists() else []) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # they are writing
        victim = next(m for m in cluster.masters() if m is not cluster.nodes[0])
        assert cluster.replicas_of(victim)  # a live replica, promoted only after 15 s
        victim.kill()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        cluster.stop()
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    builds = log.read_text().split()
    assert set(builds) == set(keys) and len(builds) <= 18, sorted(builds)
    assert all(r["seconds"] < len(keys) * 0.4 + 10 for r in reports), [r["seconds"] for r in reports]
    for r in reports:
        assert len(r["warnings"]) <= 1 and not any("waited" in w for w in r["warnings"]), r["warnings"]


def cluster_slot_of(key: str) -> int:
    import redis.crc
    return int(redis.crc.key_slot(f"kc:sick:v2:e:{{{key}}}".encode()))


def slots_served_by_others(cluster: RedisCluster, victim: RedisServer) -> set[int]:
    import redis
    return {slot for start, end, primary, *_ in redis.Redis(port=cluster.nodes[0].port).execute_command("CLUSTER SLOTS")
            if int(primary[1]) != victim.port for slot in range(start, end + 1)}


# Redirects --------------------------------------------------------------------------------------------
def _owns_every_slot(port: int) -> bytes:
    return b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n" % port


def _redirecting(default) -> FakeRedis:
    fake = FakeRedis("reply", default=default)
    fake.replies[b"CLUSTER"] = _owns_every_slot(fake.port)
    return fake


@pytest.mark.parametrize("loop", ["moved-ping-pong", "moved-spray", "ask-forever"])
def test_a_redirect_loop_costs_one_warning_and_no_hang(tmp_path, loop):
    alone = run("", tmp_path, "alone")
    ports = iter([free_port() for _ in range(30)] * 1000)  # closed ports, named in turn
    other: list[FakeRedis] = []
    if loop == "moved-ping-pong":
        first = _redirecting(lambda: b"-MOVED 1 127.0.0.1:%d\r\n" % other[0].port)
        other.append(_redirecting(lambda: b"-MOVED 1 127.0.0.1:%d\r\n" % first.port))
    elif loop == "moved-spray":
        first = _redirecting(lambda: b"-MOVED 1 127.0.0.1:%d\r\n" % next(ports))
    else:
        first = _redirecting(lambda: b"-ASK 1 127.0.0.1:%d\r\n" % first.port)
    try:
        sick = run(first.url, tmp_path, "sick", timeout=60)
    finally:
        for fake in [first, *other]:
            fake.stop()
    assert sick["seconds"] <= alone["seconds"] + 3, (sick["seconds"], alone["seconds"])
    assert sorted(sick["builds"]) == sorted(KERNELS) and sick["stats"]["compiles"] == len(KERNELS)
    [said] = sick["warnings"]
    assert ("ASK" if loop == "ask-forever" else "MOVED loop") in said, said


# Without a server ------------------------------------------------------------------------------------
def test_a_server_without_script_flags_is_read_with_the_plain_peek(tmp_path):
    """Redis before 7 refuses a script's `#!lua flags=` line: the read goes on with the plain
    script, through the small reader and through redis-py alike, and the server is not at fault."""
    from test_remote_level import remote

    def script(fake: FakeRedis, loaded: set[bytes]):
        def reply() -> bytes:
            verb, *words = fake.commands[-1]
            if verb.upper() == b"EVALSHA":
                return fake.nil() if words[0] in loaded else b"-NOSCRIPT No matching script.\r\n"
            text = words[1] if verb.upper() == b"SCRIPT" else words[0]
            if text.startswith(b"#!"):
                return b"-ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'\r\n"
            if verb.upper() == b"EVAL":
                return fake.nil()
            loaded.add(hashlib.sha1(text).hexdigest().encode())
            return b"$40\r\n" + hashlib.sha1(text).hexdigest().encode() + b"\r\n"
        return reply
    for light in (True, False):
        with FakeRedis("reply") as fake:
            loaded: set[bytes] = set()
            fake.replies.update({b"EVALSHA": script(fake, loaded), b"EVAL": script(fake, loaded),
                                 b"SCRIPT": script(fake, loaded),
                                 b"CLUSTER": b"-ERR This instance has cluster support disabled\r\n"})
            level = remote(fake.url, namespace="old")
            if not light:
                level.link  # noqa: B018  # redis-py serves every read
            assert level.get(KERNELS[0]) is None and level.get(KERNELS[1]) is None
            assert level.counters["breaker_openings"] == 0 and level.counters["misses"] == 2
            assert level._plain_peek and not any(c[1:2] == [b"LOAD"] and c[2].startswith(b"#!")
                                                 for c in fake.commands[-3:])  # the plain one, from then on


def test_a_stand_in_is_the_next_available_primary_in_slot_order_and_its_tag_lands_there():
    import redis.crc

    from kernel_cache.levels.remote.redis_slots import parse

    reply = [[0, 5460, [b"a", 1]], [5461, 10922, [b"b", 2]], [10923, 16383, [b"c", 3]]]
    slot_map = parse(reply, "h")
    up = {"a:1", "b:2", "c:3"}
    assert slot_map.next_primary(100, lambda n: n != "a:1" and n in up) == "b:2"
    assert slot_map.next_primary(12000, lambda n: n != "c:3" and n in up) == "a:1"  # wraps
    assert slot_map.next_primary(100, lambda n: n == "c:3") == "c:3"  # b skipped too
    assert slot_map.next_primary(100, lambda n: False) is None
    from kernel_cache.levels.remote.redis_link import RedisLink
    link = RedisLink(["redis://127.0.0.1:1/0"], "e", timeout=0.1, max_reply_bytes=1 << 20, breaker_seconds=1.0,
                     counters={})
    link.cluster, link._map = True, slot_map
    tag = slot_map.stand_in_tag("b:2", redis.crc.key_slot)
    assert tag is not None and 5461 <= redis.crc.key_slot(tag.encode()) <= 10922
    assert parse(reply, "h").stand_in_tag("b:2", redis.crc.key_slot) == tag  # derived alike by every process
    name = "kc:t:v2:l:{" + "0" * 31 + "1}"
    owner = slot_map.owners[redis.crc.key_slot(name.encode())]
    link.health(owner).faults_in_a_row = 1  # its node skipped (no prober here: nothing revives it)
    link._next_refresh = time.monotonic() + 60  # no slot map to read again here
    placed = link.placement(name)
    assert placed and slot_map.owners[redis.crc.key_slot(placed.encode())] != owner
