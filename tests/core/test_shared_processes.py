"""Shared level across processes (each with its own local level, like ranks on different nodes):
single-flight, writers and lock holders killed with SIGKILL, stale soft locks.

Builds are synthetic (a short sleep, deterministic bytes): the store does not care what it holds.
The same scenarios run over sshfs in test_shared_sshfs.py, through `SHARED_DIR_FACTORY` there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import child_env

from kernel_cache.levels.shared import SharedLevel
from kernel_cache.telemetry import warnings_once
from kernel_cache.trust import safefs

REPO = Path(__file__).resolve().parents[2]
KEY = "0123456789abcdef0123456789abcdef"

# A rank: waits for the start signal, then get_or_create()s every key in order; reports JSON.
RANK = textwrap.dedent("""
    import hashlib, json, os, sys, time, warnings
    from pathlib import Path
    from kernel_cache import Config, KernelCacheWarning, Store

    shared, local, lock, go, keys = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5:]
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        store = Store(Config(dir=Path(local), shared_dir=Path(shared), lock=lock, lock_timeout=120))
        while not go.exists():
            time.sleep(0.005)
        built, digests = [], {}
        for key in keys:
            def build(key=key):
                built.append(key)
                time.sleep(0.05)
                return {"k": key}, {"cubin": hashlib.sha256(key.encode()).digest() * 512}, 0.05
            meta, blobs = store.get_or_create(key, build)
            digests[key] = hashlib.sha256(blobs["cubin"]).hexdigest()
    print(json.dumps({"built": built, "digests": digests, "errors": store.stats.session()["errors"],
                      "lock_kind": store.shared.lock_kind if store.shared else None,
                      "warnings": [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]}))
""")

# Publishes KEY but pauses between write and rename (test hook) until killed.
PAUSED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kernel_cache import Config, Store
    from kernel_cache.trust import safefs

    def pause(point, tmp):
        if tmp.startswith(sys.argv[1]):  # the shared level's publish (the local level's passes)
            print("PAUSED", tmp, flush=True)
            time.sleep(600)

    store = Store(Config(dir=Path(sys.argv[2]), shared_dir=Path(sys.argv[1]), lock=sys.argv[3]))
    safefs.set_fault_hook(pause)  # after opening: the cache directories' markers publish first
    store.get_or_create(sys.argv[4], lambda: ({"k": 1}, {"cubin": b"x" * 4096}, 0.01))
""")

# Takes KEY's shared lock and holds it until killed.
LOCK_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kernel_cache.levels.shared import SharedLevel

    level = SharedLevel(Path(sys.argv[1]), lock_mode=sys.argv[2], stale_after=float(sys.argv[3]))
    with level.lock(sys.argv[4], 10) as held:
        print("HELD" if held else "NOT-HELD", flush=True)
        time.sleep(600)
""")


def spawn(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(PYTHONDONTWRITEBYTECODE="1"))


def wait_for_line(proc: subprocess.Popen, prefix: str) -> str:
    line = proc.stdout.readline()
    assert line.startswith(prefix), f"child said {line!r}; stderr: {proc.stderr.read()}"
    return line


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()  # reaped: its pid is gone, as after a node's process dies


def run_ranks(shared: Path | list[Path], tmp_path: Path, lock: str, n: int, keys: list[str]) -> list[dict]:
    """n ranks, each with its own local level; rank i uses shared[i % len(shared)] (one mount per node)."""
    mounts = shared if isinstance(shared, list) else [shared]
    go = tmp_path / f"go-{lock}-{n}-{time.monotonic_ns()}"
    procs = [spawn(RANK, mounts[i % len(mounts)], tmp_path / f"node-{lock}-{i}", lock, go, *keys)
             for i in range(n)]
    time.sleep(0.3)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def assert_single_flight(results: list[dict], keys: list[str]) -> None:
    built = [k for r in results for k in r["built"]]
    assert sorted(built) == sorted(keys), "each key built exactly once across all processes"
    for key in keys:
        assert len({r["digests"][key] for r in results}) == 1  # every rank got identical bytes
    assert [r["errors"] for r in results] == [0] * len(results)
    assert [r["warnings"] for r in results] == [[]] * len(results)


@pytest.fixture(autouse=True)
def _fresh_warnings():
    warnings_once.reset()
    yield
    safefs.set_fault_hook(None)


@pytest.fixture
def shared(tmp_path) -> Path:
    d = tmp_path / "shared"
    d.mkdir()
    return d


KEYS = [f"{i:02x}" * 16 for i in range(6)]


# Scenarios, parametrised over the lock kind; test_shared_sshfs.py reuses them on sshfs.
def scenario_single_flight(shared: Path | list[Path], tmp_path: Path, lock: str, n: int = 16) -> list[dict]:
    results = run_ranks(shared, tmp_path, lock, n, KEYS)
    assert_single_flight(results, KEYS)
    return results


def scenario_writer_killed_mid_publish(shared: Path, tmp_path: Path, lock: str, other: Path | None = None) -> None:
    """The writer publishes through `shared`; readers look through `other` (another node's mount)."""
    writer = spawn(PAUSED_WRITER, shared, tmp_path / "writer", lock, KEY)
    shared_root, shared = shared, other or shared
    tmp = Path(wait_for_line(writer, "PAUSED").split(maxsplit=1)[1].strip())
    assert tmp.exists() and tmp.parent == shared_root / "entries" / KEY[:2]
    tmp = shared / tmp.relative_to(shared_root)
    reader = SharedLevel(shared, lock_mode=lock)
    assert KEY not in reader and reader.get(KEY) is None  # nothing partial is visible
    kill(writer)
    assert reader.get(KEY) is None and list(reader.keys()) == []

    results = run_ranks(shared, tmp_path, lock, 1, [KEY])  # the next process compiles at once
    assert results[0]["built"] == [KEY] and results[0]["warnings"] == []
    assert reader.get(KEY) is not None
    assert tmp.exists()
    removed = [path for path, _ in reader.remove_debris(older_than_seconds=0)]  # cachectl prune's job
    assert str(tmp) in removed and not tmp.exists()
    assert all(p == str(tmp) or "/locks/" in p for p in removed)  # plus unheld lock files only
    assert reader.get(KEY) is not None


def scenario_lock_holder_killed(shared: Path, tmp_path: Path, lock: str, other: Path | None = None) -> None:
    holder = spawn(LOCK_HOLDER, shared, lock, 3600, KEY)
    wait_for_line(holder, "HELD")
    level = SharedLevel(other or shared, lock_mode=lock, stale_after=3600)
    with level.lock(KEY, 0.2) as held:
        assert held is False  # a live holder is respected
    kill(holder)
    with level.lock(KEY, 30) as held:
        assert held is True  # released with the process (flock) or taken over: pid is dead (soft)


@pytest.mark.parametrize("lock", ["flock", "soft"])
def test_16_processes_cold_dir_build_each_key_once(shared, tmp_path, lock):
    results = scenario_single_flight(shared, tmp_path, lock)
    assert {r["lock_kind"] for r in results} == {lock}


def test_auto_lock_single_flight(shared, tmp_path):
    scenario_single_flight(shared, tmp_path, "auto", n=4)


@pytest.mark.parametrize("lock", ["flock", "soft"])
def test_writer_killed_between_write_and_rename_leaves_nothing_visible(shared, tmp_path, lock):
    scenario_writer_killed_mid_publish(shared, tmp_path, lock)


@pytest.mark.parametrize("lock", ["flock", "soft"])
def test_lock_of_a_killed_holder_is_released(shared, tmp_path, lock):
    scenario_lock_holder_killed(shared, tmp_path, lock)


def test_stale_soft_lock_of_a_dead_node_expires(shared):
    scenario_stale_marker_of_a_dead_node(shared)


def scenario_stale_marker_of_a_dead_node(shared: Path) -> None:
    level = SharedLevel(shared, lock_mode="soft", stale_after=2)
    marker = shared / "locks" / KEY[:2] / f"{KEY}.softlock"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("4242\nnode-that-crashed\n")  # another host: its pid cannot be probed from here
    with level.lock(KEY, 0.2) as held:
        assert held is False  # fresh: could be a live holder on that node
    old = time.time() - 60
    os.utime(marker, (old, old))
    with level.lock(KEY, 30) as held:
        assert held is True  # not refreshed for longer than stale_after: taken over


def test_live_soft_lock_holder_keeps_its_lock_by_heartbeat(shared):
    holder = spawn(LOCK_HOLDER, shared, "soft", 1.5, KEY)
    try:
        wait_for_line(holder, "HELD")
        level = SharedLevel(shared, lock_mode="soft", stale_after=1.5)
        with level.lock(KEY, 4) as held:  # waits well past stale_after
            assert held is False  # the heartbeat kept the marker fresh
    finally:
        kill(holder)


def test_waiters_give_up_after_the_bound_and_compile(shared, tmp_path):
    holder = spawn(LOCK_HOLDER, shared, "flock", 3600, KEY)
    try:
        wait_for_line(holder, "HELD")
        script = RANK.replace("lock_timeout=120", "lock_timeout=0.5")
        proc = spawn(script, shared, tmp_path / "node", "flock", tmp_path / "go", KEY)
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["built"] == [KEY]  # compiled for itself rather than hang
        assert len(result["warnings"]) == 1 and "compiling here instead" in result["warnings"][0]
    finally:
        kill(holder)
