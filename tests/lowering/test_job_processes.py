"""A `jax.distributed` job of several processes on loopback (CPU, cross-lowering for sm_90), each with its
own empty cache directory and no shared or remote level: its processes share kernels through the job's
key-value store and compile each once (tests/support/job_child.py); with KERNEL_CACHE_JOB=0 each
compiles its own. A holder killed mid-compile costs the others one lease lifetime on the real
coordinator. And how the lowering joins the job: only where a job of several processes runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, child_env
from redis_server import free_port

from kernel_cache import Config, Store
from lowering import first_use, jax_compat

CHILD = ROOT / "tests" / "support" / "job_child.py"
KERNELS = 14  # the example programs' kernels (the autotuned matmul's six configs among them)
OFF = "add[BLOCK=256],add[BLOCK=512]"  # lowered first with the job level off: a kernel each


def start(tmp: Path, tag: str, port: int, process: int, processes: int, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), *args[:1], str(tmp / f"{tag}{process}.json"), str(port),
                             str(process), str(processes), *args[1:]],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(KERNEL_CACHE_DIR=str(tmp / f"{tag}{process}-cache"), **env))


def reports(tmp: Path, tag: str, procs: list[subprocess.Popen], timeout: float = 240) -> list[dict]:
    outs = [p.communicate(timeout=timeout) for p in procs]
    for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"process {i} failed ({p.returncode}):\n{err[-4000:]}"
    return [json.loads((tmp / f"{tag}{i}.json").read_text()) for i in range(len(procs))]


def lowering_job(tmp: Path, tag: str, processes: int, off_labels: str) -> list[dict]:
    port = free_port()
    return reports(tmp, tag, [start(tmp, tag, port, i, processes, "lower", off_labels) for i in range(processes)])


@pytest.mark.slow
def test_a_job_of_four_compiles_each_kernel_once_and_each_its_own_with_the_level_off(tmp_path):
    """Each process first lowers two programs with KERNEL_CACHE_JOB=0 (a session of its own, its own
    empty directory): 2 compiles each. Then all of them, as a process alone does."""
    alone = lowering_job(tmp_path, "alone", 1, OFF)[0]
    assert alone["stats"]["compiles"] == KERNELS and alone["job"] is None
    ran = lowering_job(tmp_path, "job", 4, OFF)
    assert [r["off"]["stats"]["compiles"] for r in ran] == [2, 2, 2, 2]
    assert all(r["off"]["levels"] == ["memory", "disk"] for r in ran)
    compiles = sum(r["stats"]["compiles"] for r in ran)
    assert compiles <= KERNELS + 2, [r["stats"]["compiles"] for r in ran]
    assert all(r["levels"] == ["memory", "disk", "job"] and r["job"]["mode"] == "read-write" for r in ran)
    assert all(r["lowered_sha"] == alone["lowered_sha"] for r in ran)  # the same programs, whoever compiled
    assert sum(r["stats"]["hits"]["job"] for r in ran) >= 3 * KERNELS - compiles
    slowest = max(r["lowering"] for r in ran)
    assert slowest <= 1.5 * alone["lowering"] + 3, (slowest, alone["lowering"])
    assert not [w for r in ran for w in r["warnings"]]


@pytest.mark.slow
def test_a_holder_killed_mid_compile_costs_one_lease_lifetime(tmp_path):
    """The job goes on when a process other than the coordinator's dies (the coordinator serves the
    others until its heartbeat timeout): the lease of 2 s the killed holder took is taken over."""
    port, mark = free_port(), tmp_path / "held"
    holder = start(tmp_path, "lease", port, 1, 2, "lease", "holder", str(mark))  # not 0: it runs the coordinator
    waiter = start(tmp_path, "lease", port, 0, 2, "lease", "waiter", str(mark))
    deadline = time.monotonic() + 120
    while not mark.exists() and holder.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mark.read_text() == "True"
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate()
    got = reports(tmp_path, "lease", [waiter])[0]
    assert got["got"] is True and got["counters"]["takeovers"] == 1, got
    assert got["waited"] < 2.0 + 3.0, got  # one lease lifetime and polling, not the wait of 60 s
    assert got["published_by"] == "0"


class FakeJaxClient:
    """jax.distributed's client as far as the level's calls go, answering as the coordinator does."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def key_value_try_get_bytes(self, key: str) -> bytes:
        if key not in self.values:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.values[key]

    def key_value_set_bytes(self, key: str, value: bytes, allow_overwrite: bool = False) -> None:
        if key in self.values and not allow_overwrite:
            raise RuntimeError(f"ALREADY_EXISTS: key {key} already exists.")
        self.values[key] = value

    def key_value_delete(self, key: str) -> None:
        self.values.pop(key, None)


@pytest.fixture
def distributed_state(monkeypatch):
    from jax._src import distributed

    state = SimpleNamespace(client=FakeJaxClient(), num_processes=4, process_id=2)
    monkeypatch.setattr(distributed, "global_state", state)
    return state


def test_the_client_answers_as_the_level_asks(distributed_state):
    store, process, processes = jax_compat.job_store()
    assert (process, processes) == (2, 4)
    assert store.get("a") is None
    assert store.create("a", b"1") and not store.create("a", b"2")
    store.overwrite("a", b"3")
    assert store.get("a") == b"3"
    store.delete("a")
    assert store.get("a") is None
    distributed_state.client.key_value_try_get_bytes = lambda key: (_ for _ in ()).throw(
        RuntimeError("UNAVAILABLE: failed to connect"))
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        store.get("a")


def test_the_store_joins_a_job_of_several_processes_only(tmp_path, distributed_state):
    store = Store(Config(dir=tmp_path / "a"))
    first_use.join_job(store)
    assert [t.name for t in store.levels] == ["memory", "disk", "job"]
    assert "process 2 of 4" in store.level("job").location
    for config in (Config(dir=tmp_path / "b", job=False), Config(disabled=True)):
        other = Store(config)
        first_use.join_job(other)
        assert other.level("job") is None
    distributed_state.num_processes = 1
    lone = Store(Config(dir=tmp_path / "c"))
    first_use.join_job(lone)
    assert lone.level("job") is None
    distributed_state.client = None
    assert jax_compat.job_store() is None
