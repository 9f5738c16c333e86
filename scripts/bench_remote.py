"""Remote-level benchmark, measured side by side in one run on this machine against a real
redis-server it starts itself (on a free loopback port, persistence off; `redis-server` must be on
PATH).

Prints:
- hit latency by entry size (4 KiB ... 8 MiB) for the memory, disk, shared and remote levels (p50 of
  fresh reads), with each level's ratio to the disk;
- a warm process lowering lowering.examples' 9 programs (cross-lowered for sm_90) served from the
  remote alone, or from a shared directory alone (a new, empty local dir each time: a fresh node,
  without a toolchain memo of its own; on this host the one the seeding node published to the
  cluster's levels serves it) vs from its local disk: lowering seconds, ratios;
- N processes x M keys (synthetic 10 ms builds) warming one namespace at once: time to warm and the
  number of builds, with the server healthy, and with it killed at a random moment within the
  healthy run's length (then started again): every process must finish, and builds stay close to M;
  then on a 3-master + 3-replica Redis Cluster (hit p50 at 64 KiB beside one server's), healthy and
  with a master killed at a random moment (its replica promoted);
- a sick remote beside none: one process lowering the 9 programs from a new, empty local dir with no
  remote, then with a refused port, a full server (maxmemory, noeviction), one paused for writes, a
  cluster that lost a shard, a master SIGSTOPped under a 15 s node timeout, and fake nodes that
  answer MOVED in a ping-pong, MOVED to 30 closed endpoints in turn, or ASK forever;
- a fleet lowering the 9 programs: N processes (each its own new local dir) started at once on a new
  3-master + 3-replica Redis Cluster, healthy, and for each `--node-timeouts` a master killed 1-3 s
  after the first of them starts lowering: compiles per kernel between them, warnings, the slowest
  lowering (`--gpu`: on this host's GPUs, processes spread over them; else cross-lowered);
- hostile rows beside a healthy one (peak RSS and seconds of a process lowering the 9 programs from
  a new, empty local dir, under the default entry cap of 256 MiB, or --hostile-cap): a 200 MB value
  planted at the name of the lowered-call record it reads first (planted again before each round:
  the round lowers kernel by kernel from the remote and its verified record replaces the plant), and
  a fake server trickling one byte every 50 ms (tests/support/fake_resp.py) beside no remote at all.

    python scripts/bench_remote.py [--processes 16] [--keys 200] [--rounds 5] [--only hostile] [--hostile-cap 64M]
                                   [--fleet 8] [--gpu] [--node-timeouts 5000,15000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "tests" / "support"  # the servers the tests start, and the fake one
for _path in (SUPPORT, ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fake_resp import FakeRedis  # noqa: E402
from redis_cluster import RedisCluster  # noqa: E402
from redis_server import RedisServer, free_port  # noqa: E402

SIGNING_KEY = "bench-remote-signing-key-0123456789"
SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("KERNEL_CACHE_")}
    out.update(PYTHONPATH=str(ROOT) + os.pathsep + out.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    out.update(extra)
    return out


HITS = r'''
import json, os, statistics, sys, time
from pathlib import Path
from kernel_cache import Config, Entry, Store
from kernel_cache.trust.signing import Signer
url, tmp, size, rounds = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
key = bytes(sys.argv[5], "ascii")
(tmp / "shared").mkdir(parents=True, exist_ok=True)
store = Store(Config(dir=tmp / "local", shared_dir=tmp / "shared", remote=url, remote_namespace=f"hits{size}",
                     signing_key=key))
keys = [f"{i + 1:032x}" for i in range(rounds)]
for k in keys:
    store.put(Entry(key=k, meta={"name": "bench"}, blobs={"cubin": os.urandom(size)}))
def timed(level):
    out = []
    for k in keys:
        t = time.perf_counter(); assert level.get(k) is not None; out.append(time.perf_counter() - t)
    return statistics.median(out)
print(json.dumps({name: timed(store.level(name)) for name in ("memory", "disk", "shared", "remote")}))
'''

LOWER = r'''
import json, resource, time, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
import jax
from lowering import examples
import kernel_cache
start = time.perf_counter()
for _, fn, shapes in examples.programs(compute_capability=90):
    jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
lowering = time.perf_counter() - start
print(json.dumps({"lowering": lowering, "stats": kernel_cache.default_store().stats.session(),
                  "wall": time.perf_counter() - t0,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''

FLEET = r'''
import json, os, time, warnings
t0 = time.perf_counter()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jax
    from lowering import examples
    import kernel_cache
    if os.environ.get("FLEET_STARTED"):
        open(os.environ["FLEET_STARTED"], "a").close()  # the bench injects its fault from the first of these
    start = time.perf_counter()
    for _, fn, shapes in examples.programs(compute_capability=90):
        jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
    lowering = time.perf_counter() - start
said = [str(w.message) for w in caught if "remote cache" in str(w.message) or "waited" in str(w.message)]
print(json.dumps({"stats": kernel_cache.default_store().stats.session(), "wall": time.perf_counter() - t0,
                  "lowering": lowering, "warnings": said}))
'''

WARM = r'''
import json, sys, time
from kernel_cache import Config, Store
url, local, keys, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
store = Store(Config(dir=local, remote=url, remote_namespace="warm", remote_timeout=0.25, lock_timeout=60,
                     signing_key=bytes(sys.argv[5], "ascii")))
def build(k):
    def b():
        with open(log, "a") as f:
            f.write(k + "\n")
        time.sleep(0.01)
        return {"kernel": "synthetic"}, {"cubin": k.encode() * 32}, 0.01
    return b
order = [f"{i + 1:032x}" for i in range(keys)]
import random; random.shuffle(order)
for k in order:
    assert store.get_or_create(k, build(k))[1]["cubin"] == k.encode() * 32
print("ok")
'''


def child(code: str, *args: str, **extra: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env(**extra), capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"child failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def hit_latency(server: RedisServer, tmp: Path, rounds: int) -> None:
    print("hit latency, p50 of fresh reads (ratio to disk)")
    print(f"{'entry':>8} {'memory':>16} {'disk':>12} {'shared':>16} {'remote':>16}")
    for size in SIZES:
        r = json.loads(child(HITS, server.url, str(tmp / f"hits{size}"), str(size), str(rounds), SIGNING_KEY))
        cells = [f"{r[n] * 1e3:7.3f} ms" + (f" {r[n] / r['disk']:5.2f}x" if n != "disk" else "")
                 for n in ("memory", "disk", "shared", "remote")]
        print(f"{size >> 10:>6}Ki {cells[0]:>16} {cells[1]:>12} {cells[2]:>16} {cells[3]:>16}")


def warm_process(server: RedisServer, tmp: Path, rounds: int) -> None:
    """A fresh node (a new, empty local dir each time: no toolchain memo of its own; the seed's, which
    sees the same files, is in the cluster's levels) served by the remote alone or by a shared
    directory alone, beside a warm node served by its own local disk."""
    common = {"KERNEL_CACHE_SIGNING_KEY_FILE": str(tmp / "key")}
    remote = {"KERNEL_CACHE_REMOTE": server.url, "KERNEL_CACHE_REMOTE_NAMESPACE": "programs"}
    shared = {"KERNEL_CACHE_SHARED_DIR": str(tmp / "shared-programs")}
    (tmp / "shared-programs").mkdir()
    first = json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / "seed"), **common, **remote, **shared))
    remote_only, shared_only, local = [], [], []
    for i in range(rounds):  # interleaved: the box's speed drifts, the ratio does not
        r = json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / f"fresh{i}"), **common, **remote))
        remote_only.append(r["lowering"])
        assert r["stats"]["compiles"] == 0, r["stats"]
        r = json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / f"fresh-shared{i}"), **common, **shared))
        shared_only.append(r["lowering"])
        assert r["stats"]["compiles"] == 0, r["stats"]
        local.append(json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / "seed"), **common, **remote))["lowering"])
    ro, so, lo = statistics.median(remote_only), statistics.median(shared_only), statistics.median(local)
    print(f"\nwarm process, 9 programs / 14 kernels lowered (median of {rounds}; cold first: "
          f"{first['lowering']:.2f} s, {first['stats']['compiles']} compiles)")
    print(f"  served from the remote alone  {ro:.3f} s   from the local disk  {lo:.3f} s   ratio {ro / lo:.2f}x")
    print(f"  served from a shared dir alone  {so:.3f} s   from the local disk  {lo:.3f} s   ratio {so / lo:.2f}x")


PLANTED_BYTES = 200 << 20


def _first_read(plain: Any, namespace: str) -> bytes:
    """The entry name a warm process reads first: a lowered-call record's (the largest one)."""
    from kernel_cache.entries import entry as entry_format
    from kernel_cache.entries.call_entry import KIND

    records = []
    for name in plain.scan_iter(match=f"kc:{namespace}:v2:e:*"):
        size = int(plain.strlen(name))
        meta = entry_format.peek_meta_head(plain.getrange(name, 0, entry_format.META_PEEK_BYTES - 1), size)
        if meta.get("kind") == KIND:
            records.append((size, name))
    return bytes(max(records)[1])


def hostile(server: RedisServer, tmp: Path, rounds: int, cap: str | None = None) -> None:
    """A warm process's memory and time against a healthy server, one with a planted 200 MB value, a
    trickling server, and no remote at all (the last two compile everything: the cost to compare)."""
    import redis

    common = {"KERNEL_CACHE_SIGNING_KEY_FILE": str(tmp / "key")}
    if cap is not None:
        common["KERNEL_CACHE_MAX_ENTRY_BYTES"] = cap
    plain = redis.Redis.from_url(server.url, socket_timeout=60)
    for namespace in ("healthy", "planted"):
        child(LOWER, KERNEL_CACHE_DIR=str(tmp / f"seed-{namespace}"), KERNEL_CACHE_REMOTE=server.url,
              KERNEL_CACHE_REMOTE_NAMESPACE=namespace, **common)
    target = _first_read(plain, "planted")
    rows: dict[str, list[dict[str, Any]]] = {"healthy": [], "planted": [], "trickling": [], "none": []}
    healed = []
    with FakeRedis("trickle", interval=0.05) as fake:
        for i in range(rounds):  # interleaved: the box's speed drifts, the ratios do not
            rows["healthy"].append(json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / f"h{i}"),
                                                    KERNEL_CACHE_REMOTE=server.url,
                                                    KERNEL_CACHE_REMOTE_NAMESPACE="healthy", **common)))
            plain.set(target, b"\0" * PLANTED_BYTES)
            rows["planted"].append(json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / f"p{i}"),
                                                    KERNEL_CACHE_REMOTE=server.url,
                                                    KERNEL_CACHE_REMOTE_NAMESPACE="planted", **common)))
            healed.append(int(plain.strlen(target)) < PLANTED_BYTES)
            if i == 0:  # the last two compile all 14 kernels: once is enough to compare
                rows["trickling"].append(json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / f"t{i}"),
                                                          KERNEL_CACHE_REMOTE=fake.url,
                                                          KERNEL_CACHE_REMOTE_UNSIGNED="1", **common)))
                rows["none"].append(json.loads(child(LOWER, KERNEL_CACHE_DIR=str(tmp / f"n{i}"), **common)))
    print(f"\nhostile server or peer: a process lowering the 9 programs from a new local dir "
          f"(KERNEL_CACHE_MAX_ENTRY_BYTES={cap or 'default, 256M'}; median of {rounds}, the last two rows once)")
    print(f"  {'row':<48} {'lowering':>9} {'process':>9} {'peak RSS':>10} {'compiles':>9}")
    labels = {"healthy": "healthy server",
              "planted": f"{PLANTED_BYTES >> 20} MB value planted at a call record's name",
              "trickling": "fake server trickling 1 byte / 50 ms",
              "none": "no remote at all (what a trickle must not exceed)"}
    for name, results in rows.items():
        low = statistics.median(r["lowering"] for r in results)
        wall = statistics.median(r["wall"] for r in results)
        rss = statistics.median(r["peak_rss_mib"] for r in results)
        compiles = statistics.median(r["stats"]["compiles"] for r in results)
        print(f"  {labels[name]:<48} {low:8.3f}s {wall:8.3f}s {rss:8.0f}Mi {compiles:9.0f}")
    print(f"  planted value replaced by the round's verified build: {sum(healed)} of {len(healed)} rounds")


def many_processes(server: RedisServer, tmp: Path, processes: int, keys: int) -> None:
    """The fleet warming one namespace: on one server healthy, killed and restarted; on a 3-master +
    3-replica Redis Cluster healthy, and with a master killed (its replica promoted)."""
    print(f"\n{processes} processes x {keys} keys (10 ms builds), one namespace")
    healthy = _fleet(server.url, tmp / "one", processes, keys, "server healthy", server.flush)
    def restart() -> None:
        server.kill()
        time.sleep(0.5)
        server.start()
    _fleet(server.url, tmp / "one-chaos", processes, keys, "server killed at {at:.1f} s, restarted", server.flush,
           fault=restart, at=random.uniform(0.2, 0.8) * healthy)
    for name, fault in (("healthy", False), ("master killed", True)):
        cluster = RedisCluster(tmp / f"cluster-{fault}")
        try:
            if not fault:
                r = json.loads(child(HITS, cluster.url, str(tmp / "cluster-hits"), str(64 << 10), "20", SIGNING_KEY))
                one = json.loads(child(HITS, server.url, str(tmp / "one-hits"), str(64 << 10), "20", SIGNING_KEY))
                print(f"  hit p50 at 64 KiB: cluster {r['remote'] * 1e3:.3f} ms, one server {one['remote'] * 1e3:.3f} ms")
            kill = (lambda c=cluster: next(m for m in c.masters() if m is not c.nodes[0]).kill()) if fault else None
            label = f"3-master cluster {name}" + (" at {at:.1f} s" if fault else "")
            _fleet(cluster.url, tmp / f"cluster-fleet-{fault}", processes, keys, label, None, fault=kill,
                   at=random.uniform(0.2, 0.8) * healthy)
        finally:
            cluster.stop()


def _fleet(url: str, tmp: Path, processes: int, keys: int, label: str, reset: Any, fault: Any = None,
           at: float = 0.0) -> float:
    """One row: `processes` children warming `keys` keys on `url` (a fault injected `at` seconds in);
    prints the time to warm, builds per key and failed processes; returns the time to warm."""
    if reset is not None:
        reset()
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "builds.log"
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WARM, url, str(tmp / f"n{i}"), str(keys), str(log), SIGNING_KEY],
                              cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(processes)]
    if fault is not None:
        time.sleep(at)
        fault()
    outs = [p.communicate(timeout=900) for p in procs]
    wall = time.perf_counter() - start
    failed = [err[-500:] for p, (_, err) in zip(procs, outs, strict=True) if p.returncode != 0]
    builds = log.read_text().split() if log.exists() else []
    most = max((builds.count(k) for k in set(builds)), default=0)
    print(f"  {label.format(at=at):<40} time to warm {wall:6.2f} s   builds {len(builds)} for {keys} keys "
          f"({len(builds) / keys:.2f}x, at most {most} of one key)   failed processes {len(failed)}")
    for err in failed:
        print("   ", err)
    return wall


def fleet(tmp: Path, processes: int, gpu: bool, node_timeouts: list[int]) -> None:
    """N processes lowering the 9 programs at once on a new cluster: healthy, then for each node
    timeout a master killed 1-3 s after the first starts lowering (imports done); the fleet ends
    before a 15 s node timeout promotes its replica, so its keys live on a stand-in meanwhile."""
    print(f"\nfleet: {processes} processes lowering the 9 programs at once (each its own new local dir), "
          f"3-master + 3-replica cluster" + (" (GPUs of this host)" if gpu else " (cross-lowered for sm_90)"))
    print(f"  {'row':<44} {'compiles':>8} {'per kernel':>10} {'slowest':>8} {'warnings':>8} {'waited':>7}")
    kernels = 0
    for node_timeout, fault in [(node_timeouts[-1], False)] + [(t, True) for t in node_timeouts]:
        cluster = RedisCluster(tmp / f"fleet-{node_timeout}-{fault}", node_timeout_ms=node_timeout)
        try:
            at = random.uniform(1.0, 3.0)
            results = _lowering_fleet(cluster, tmp / f"fleet-{node_timeout}-{fault}", "a", processes, gpu,
                                      (at, next(m for m in cluster.masters() if m is not cluster.nodes[0]).kill)
                                      if fault else None)
            compiles = sum(r["stats"]["compiles"] for r in results)
            kernels = kernels or compiles  # the healthy row compiles each kernel once
            label = f"node timeout {node_timeout / 1000:g} s, " + (f"master killed at {at:.1f} s" if fault else "healthy")
            _fleet_row(label, results, kernels)
        finally:
            cluster.stop()


def sick(tmp: Path) -> None:
    """One process lowering the 9 programs from a new, empty local dir with no remote, then with
    each fault (a real server or cluster, or a fake node for the redirects), side by side."""
    print("\nsick remote: one process lowering the 9 programs (cross-lowered for sm_90), new local dir each")
    print(f"  {'fault':<44} {'lowering':>8} {'vs none':>8} {'compiles':>8} {'warnings':>8}")
    base = {"KERNEL_CACHE_SIGNING_KEY_FILE": str(tmp / "key"), "KERNEL_CACHE_REMOTE_NAMESPACE": "sick"}
    alone: float | None = None

    def row(label: str, url: str | None) -> None:
        nonlocal alone
        extra = {**base, "KERNEL_CACHE_DIR": str(tmp / f"sick-{len(os.listdir(tmp))}")}
        if url is not None:
            extra["KERNEL_CACHE_REMOTE"] = url
        r = json.loads(child(FLEET, **extra))
        alone = alone or r["lowering"]
        print(f"  {label:<44} {r['lowering']:>7.2f}s {r['lowering'] / alone:>7.2f}x {r['stats']['compiles']:>8} "
              f"{len(r['warnings']):>8}")
        for said in r["warnings"]:
            print("     ", said[:160])

    row("no remote", None)
    home = tmp / "sick-servers"
    home.mkdir()
    gone = RedisServer(home)
    gone.kill()
    row("refused port (server down)", gone.url)
    for label, words in (("full: maxmemory reached, noeviction", ("config", "set", "maxmemory", "1")),
                         ("paused for writes: CLIENT PAUSE 60000 WRITE", ("client", "pause", "60000", "write"))):
        (home / words[0]).mkdir()
        server = RedisServer(home / words[0])
        try:
            subprocess.run(["redis-cli", "-p", str(server.port), *words], check=True, capture_output=True)
            row(label, server.url)
        finally:
            server.kill()
    cluster = RedisCluster(tmp / "sick-shard", node_timeout_ms=1000)
    try:
        victim = next(m for m in cluster.masters() if m is not cluster.nodes[0])
        for node in [victim, *cluster.replicas_of(victim)]:
            node.kill()
        cluster.wait_state("fail")
        row("cluster lost a shard (CLUSTERDOWN everywhere)", cluster.url)
    finally:
        cluster.stop()
    cluster = RedisCluster(tmp / "sick-stop", node_timeout_ms=15000)
    try:
        next(m for m in cluster.masters() if m is not cluster.nodes[0]).pause()
        row("master SIGSTOPped, node timeout 15 s", cluster.url)
    finally:
        cluster.stop()

    def redirecting(default: Any) -> FakeRedis:
        fake = FakeRedis("reply", default=default)
        fake.replies[b"CLUSTER"] = b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n" % fake.port
        return fake
    other: list[FakeRedis] = []
    closed = [free_port() for _ in range(30)]
    turn = iter(range(1 << 30))
    first = redirecting(lambda: b"-MOVED 1 127.0.0.1:%d\r\n" % other[0].port)
    other.append(redirecting(lambda: b"-MOVED 1 127.0.0.1:%d\r\n" % first.port))
    spray = redirecting(lambda: b"-MOVED 1 127.0.0.1:%d\r\n" % closed[next(turn) % 30])
    ask: list[FakeRedis] = []
    ask.append(redirecting(lambda: b"-ASK 1 127.0.0.1:%d\r\n" % ask[0].port))
    try:
        row("MOVED ping-pong between two nodes", first.url)
        row("MOVED to 30 closed endpoints in turn", spray.url)
        row("ASK forever", ask[0].url)
    finally:
        for fake in (first, *other, spray, *ask):
            fake.stop()


def _lowering_fleet(cluster: RedisCluster, tmp: Path, tag: str, processes: int, gpu: bool,
                    fault: tuple[float, Any] | None) -> list[dict[str, Any]]:
    tmp.mkdir(parents=True, exist_ok=True)
    started = tmp / f"{tag}-started"
    common = {"KERNEL_CACHE_SIGNING_KEY_FILE": str(tmp.parent / "key"), "KERNEL_CACHE_REMOTE": cluster.url,
              "KERNEL_CACHE_REMOTE_NAMESPACE": "fleet", "FLEET_STARTED": str(started)}
    if os.environ.get("BENCH_FLEET_LOGS"):
        common["KERNEL_CACHE_LOG"] = "debug"
    procs = []
    for i in range(processes):
        extra = {"JAX_PLATFORMS": "", "CUDA_VISIBLE_DEVICES": str(i % _gpus())} if gpu else {}
        procs.append(subprocess.Popen([sys.executable, "-c", FLEET], cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      env=env(KERNEL_CACHE_DIR=str(tmp / f"{tag}{i}"), **common, **extra)))
    if fault is not None:  # `fault[0]` seconds after the first process has imported jax and starts lowering
        while not started.exists() and any(p.poll() is None for p in procs):
            time.sleep(0.01)
        time.sleep(fault[0])
        fault[1]()
    outs = [p.communicate(timeout=900) for p in procs]
    logs = os.environ.get("BENCH_FLEET_LOGS")  # a folder for each process's stderr (with KERNEL_CACHE_LOG set)
    if logs:
        for i, (_, err) in enumerate(outs):
            Path(logs, f"{tmp.name}-{tag}{i}.log").write_text(err)
    failed = [err[-2000:] for p, (_, err) in zip(procs, outs, strict=True) if p.returncode != 0]
    if failed:
        raise SystemExit("a fleet process failed:\n" + failed[0])
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def _fleet_row(label: str, results: list[dict[str, Any]], kernels: int) -> None:
    compiles = sum(r["stats"]["compiles"] for r in results)
    said = [w for r in results for w in r["warnings"]]
    waited = sum("waited" in w for w in said)
    print(f"  {label:<44} {compiles:>8} {compiles / max(kernels, 1):>9.2f}x "
          f"{max(r['lowering'] for r in results):>7.2f}s {len(said):>8} {waited:>7}")


def _gpus() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return max(1, out.stdout.count("GPU "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hostile-cap", metavar="SIZE", help="KERNEL_CACHE_MAX_ENTRY_BYTES for the hostile rows "
                        "(default: the default cap, 256M: the plant is checked in chunks; 64M: past the cap)")
    parser.add_argument("--fleet", type=int, default=8, metavar="N", help="processes in the fleet rows")
    parser.add_argument("--gpu", action="store_true", help="the fleet rows lower on this host's GPUs")
    parser.add_argument("--node-timeouts", default="5000,15000", metavar="MS,MS",
                        help="cluster-node-timeout of the fleet's failover rows (Redis's default is 15000)")
    parser.add_argument("--only", choices=("hits", "warm", "hostile", "processes", "fleet", "sick"),
                        help="run one section (default: all)")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("bench_remote: redis-server is not on PATH (apt-get install redis-server)")
    tmp = Path(tempfile.mkdtemp(prefix="kc-bench-remote-"))
    server = RedisServer(tmp)
    try:
        (tmp / "key").write_text(SIGNING_KEY)
        os.chmod(tmp / "key", 0o600)
        if args.only in (None, "hits"):
            hit_latency(server, tmp, max(args.rounds * 4, 20))
        if args.only in (None, "warm"):
            warm_process(server, tmp, args.rounds)
        if args.only in (None, "hostile"):
            hostile(server, tmp, args.rounds, args.hostile_cap)
        if args.only in (None, "processes"):
            many_processes(server, tmp, args.processes, args.keys)
        if args.only in (None, "sick"):
            sick(tmp)
        if args.only in (None, "fleet"):
            fleet(tmp, args.fleet, args.gpu, [int(t) for t in args.node_timeouts.split(",")])
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
