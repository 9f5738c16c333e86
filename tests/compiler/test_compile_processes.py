"""Compile worker processes (`compiler.compile_processes`): the pool starts in the background and
closes when idle and at exit, leaving no process behind; a worker killed or hung mid-compile loses
no kernel (the parent compiles it); a kernel a worker cannot import is compiled in the parent; a
worker's entries are those of a compile in the parent, byte for byte; and the rule starts no pool
where it cannot pay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import triton
import triton.language as tl
from conftest import ROOT, child_env

from compiler import compile_processes, content_key, make_spec
from kernel_cache import Store
from kernel_cache.settings.config import Config

SOME = ("add", "scaled_add", "softmax", "matmul[0]", "flash_attention")  # a called @jit, a dot, a loop


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out: workers {compile_processes.workers()}, {compile_processes.counts()}"
        time.sleep(0.01)


def gone(pid: int) -> bool:
    """Exited and reaped (a zombie still has its /proc entry)."""
    return not os.path.exists(f"/proc/{pid}")


def comparable(artifact) -> tuple[dict, dict]:
    """An artifact's entry without its timing."""
    meta, blobs = artifact.to_entry()
    meta.pop("compile_seconds")
    return json.loads(json.dumps(meta)), blobs


@pytest.fixture
def pool(tmp_path):
    """A store of its own and this process's pool, forced to start (the rule aside), closed after."""
    compile_processes.shutdown()  # counts of its own: on a large host earlier tests' lowerings start pools
    store = Store(Config(dir=tmp_path / "cache", compile_workers=2))

    def start(size: int) -> Store:
        compile_processes.override(size)
        began = time.perf_counter()
        assert compile_processes.expect(store.config, 0) == size
        assert time.perf_counter() - began < 0.2  # the workers start on a thread: the caller goes on
        wait_for(lambda: [s for _, s in compile_processes.workers()] == ["idle"] * size)
        return store

    yield start
    compile_processes.shutdown()
    store.close()


def test_worker_entries_are_byte_equal_to_compiles_in_the_parent(pool, example_specs_sm90, compiled_sm90):
    store = pool(2)
    results = {}

    def compile_some(labels):
        for label in labels:
            results[label] = compile_processes.get_or_compile(example_specs_sm90[label], store)[0]

    threads = [threading.Thread(target=compile_some, args=(SOME[i::2],)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert compile_processes.counts()["worker"] == len(SOME) and compile_processes.counts()["parent"] == 0
    for label in SOME:
        assert comparable(results[label]) == comparable(compiled_sm90[label]), label
        assert store.lookup(content_key(example_specs_sm90[label])) is not None


def test_a_kernel_waits_for_a_busy_worker_rather_than_compile_in_the_parent(pool, example_specs_sm90, monkeypatch):
    monkeypatch.setattr(compile_processes, "WAIT_FOR_BUSY", 120.0)  # however slow this host's compiles
    store = pool(1)
    threads = [threading.Thread(target=compile_processes.get_or_compile, args=(example_specs_sm90[label], store))
               for label in ("add", "softmax")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    counts = compile_processes.counts()
    assert counts["worker"] == 2 and counts["parent"] == 0
    assert all(store.lookup(content_key(example_specs_sm90[label])) is not None for label in ("add", "softmax"))


def test_workers_yield_the_cpu_to_their_parent(pool):
    pool(1)
    [(pid, _)] = compile_processes.workers()
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, own + compile_processes.NICE)


def test_the_wait_for_a_busy_worker_is_bounded(pool, example_specs_sm90, monkeypatch):
    monkeypatch.setattr(compile_processes, "WAIT_FOR_BUSY", 0.3)
    store = pool(1)
    [(pid, _)] = compile_processes.workers()
    os.kill(pid, signal.SIGSTOP)  # busy with the first kernel until the test kills it
    stuck = threading.Thread(target=compile_processes.get_or_compile, args=(example_specs_sm90["add"], store))
    stuck.start()
    wait_for(lambda: compile_processes.workers() == [(pid, "busy")])
    began = time.perf_counter()
    artifact, _ = compile_processes.get_or_compile(example_specs_sm90["softmax"], store)
    assert artifact.cubin and time.perf_counter() - began < compile_processes.COMPILE_TIMEOUT / 10
    assert compile_processes.counts()["parent"] == 1 and compile_processes.counts()["worker"] == 0
    os.kill(pid, signal.SIGKILL)
    stuck.join(60)
    assert compile_processes.counts()["lost"] == 1 and compile_processes.counts()["parent"] == 2


def test_a_worker_killed_mid_compile_loses_no_kernel(pool, example_specs_sm90, compiled_sm90):
    store = pool(1)
    [(pid, _)] = compile_processes.workers()
    os.kill(pid, signal.SIGSTOP)  # it will not answer: killed while the request waits in its pipe
    result = {}
    thread = threading.Thread(target=lambda: result.update(art=compile_processes.get_or_compile(
        example_specs_sm90["softmax"], store)[0]))
    thread.start()
    wait_for(lambda: compile_processes.workers() == [(pid, "busy")])
    os.kill(pid, signal.SIGKILL)
    thread.join(60)
    assert comparable(result["art"]) == comparable(compiled_sm90["softmax"])
    counts = compile_processes.counts()
    assert counts["lost"] == 1 and counts["parent"] == 1 and counts["worker"] == 0
    assert compile_processes.workers() == [] and gone(pid)  # dropped and reaped


def test_a_hung_worker_times_out_and_the_parent_compiles(pool, example_specs_sm90, monkeypatch):
    monkeypatch.setattr(compile_processes, "COMPILE_TIMEOUT", 0.5)
    store = pool(1)
    [(pid, _)] = compile_processes.workers()
    os.kill(pid, signal.SIGSTOP)
    began = time.perf_counter()
    artifact, _ = compile_processes.get_or_compile(example_specs_sm90["add"], store)
    assert artifact.cubin and time.perf_counter() - began < 30
    assert compile_processes.counts()["lost"] == 1 and gone(pid)


def test_an_entry_for_another_key_is_refused(pool, example_specs_sm90, compiled_sm90):
    """The worker's entry must name the parent's content key: otherwise the parent compiles it and
    the worker (other sources or environment than the parent's) is dropped."""
    store = pool(1)
    spec = example_specs_sm90["add"]
    request = json.dumps({"recipe": compile_processes.portable(spec), "memo_dir": str(store.config.memo_dir)}).encode()
    meta, blobs, _ = compile_processes._current().build(spec, "0" * 32, request)
    meta.pop("compile_seconds")
    assert (json.loads(json.dumps(meta)), blobs) == comparable(compiled_sm90["add"])
    assert compile_processes.counts()["refused"] == 1 and compile_processes.workers() == []


def test_idle_workers_exit(pool, example_specs_sm90, monkeypatch):
    monkeypatch.setattr(compile_processes, "IDLE_SECONDS", 0.5)
    store = pool(2)
    pids = [pid for pid, _ in compile_processes.workers()]
    compile_processes.get_or_compile(example_specs_sm90["add"], store)
    assert compile_processes.counts()["worker"] == 1
    wait_for(lambda: compile_processes.workers() == [] and all(gone(pid) for pid in pids), timeout=10)
    assert compile_processes.get_or_compile(example_specs_sm90["softmax"], store)[0].cubin  # in the parent
    assert compile_processes.counts()["worker"] == 1 and compile_processes.workers() == []


@triton.jit
def _copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


def test_only_kernels_a_worker_can_import_are_sent(example_specs_sm90):
    assert compile_processes.portable(example_specs_sm90["matmul[0]"]) is not None

    def closure():
        @triton.jit
        def inner(x_ptr, out_ptr, BLOCK: tl.constexpr):
            tl.store(out_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)))
        return inner

    assert compile_processes.portable(make_spec(closure(), ["*fp32", "*fp32"], {"BLOCK": 64}, target="sm_90")) is None
    assert compile_processes.portable(make_spec(_copy, ["*fp32", "*fp32"], {"BLOCK": 64}, target="sm_90")) is not None


MAIN_AND_EXIT = """
import json, sys, time
import triton, triton.language as tl
import compiler.cache_or_compile
from compiler import compile_processes, make_spec
from compiler.examples import example_specs
import kernel_cache
from kernel_cache.settings.config import Config

@triton.jit
def main_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)) * 2)

in_parent = []
real = compiler.cache_or_compile.compile_spec
compiler.cache_or_compile.compile_spec = lambda spec: in_parent.append(spec.name) or real(spec)  # what the parent compiles
store = kernel_cache.configure(Config(dir=sys.argv[1]))  # not the environment's KERNEL_CACHE_DIR
compile_processes.override(2)
compile_processes.expect(store.config, 0)
while [s for _, s in compile_processes.workers()] != ["idle", "idle"]:
    time.sleep(0.01)
compile_processes.get_or_compile(make_spec(main_kernel, ["*fp32", "*fp32"], {"BLOCK": 64}, target="sm_90"), store)
compile_processes.get_or_compile(dict(example_specs("sm_90"))["add"], store)
print(json.dumps({"in_parent": in_parent, "counts": compile_processes.counts(),
                  "pids": [pid for pid, _ in compile_processes.workers()]}))
"""  # exits with both workers idle: the exit sequence closes them


def test_main_kernels_compile_in_the_parent_and_exit_leaves_no_worker(tmp_path):
    """A kernel of the program's `__main__` compiles in the parent, one of an importable module on a
    worker; at exit the workers are gone, and said nothing on the terminal."""
    script = tmp_path / "main_kernel.py"  # Triton reads a kernel's source from its file
    script.write_text(MAIN_AND_EXIT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cache")], cwd=ROOT, capture_output=True,
                          env=child_env(KERNEL_CACHE_DIR=str(tmp_path / "env")), text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["in_parent"] == ["main_kernel"] and report["counts"]["worker"] == 1  # add_kernel: on a worker
    assert len(report["pids"]) == 2
    wait_for(lambda: all(gone(pid) for pid in report["pids"]), timeout=5)  # reaped by the exiting parent
    assert proc.stderr == ""  # nothing of the workers on the terminal
    assert not (tmp_path / "env").exists()  # a worker's session is its parent's memo, never the environment's


@pytest.mark.parametrize("cores, threads, kernels, wanted", [
    (2, 2, [20], 0),  # too few cores: a pool's start would take the parent's
    (4, 4, [20], 0),
    (16, 1, [20], 0),  # serial: one compile at a time, as each call lowers
    (16, 16, [1], 0),  # one kernel never pays for a pool
    (32, 16, [3, 3, 3], 9),  # several misses: the process's kernels add up
    (16, 16, [20, 1], 0),  # (no pool yet, as after an idle close): a miss handing one kernel starts none
    (16, 16, [30], 8),  # at most half the cores
    (64, 12, [30], 12),  # at most the compile threads
])
def test_the_rule(tmp_path, monkeypatch, cores, threads, kernels, wanted):
    monkeypatch.setattr(compile_processes, "usable_cores", lambda: cores)
    pool = compile_processes.Pool()
    config = Config(dir=tmp_path, compile_workers=threads)
    assert [pool.wanted(config, k) for k in kernels][-1] == wanted


def test_workers_started_long_after_the_pool_was_made_are_kept(pool):
    """Idle time counts from when a worker became ready, not from when the pool was made (a process
    whose first misses started none): new workers are not closed as idle at once."""
    compile_processes._current()._last_use -= 10 * compile_processes.IDLE_SECONDS
    pool(2)
    time.sleep(1.0)
    assert [state for _, state in compile_processes.workers()] == ["idle", "idle"]


SLOW_MODULE = """
import os, time
import triton
import triton.language as tl

if os.getpid() != {parent}:  # a worker: its import waits until the test lets it go
    while not os.path.exists({flag!r}):
        time.sleep(0.01)


@triton.jit
def slow_copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)))
"""


def test_a_compile_never_waits_for_a_worker_to_import_its_kernels_module(pool, tmp_path, monkeypatch):
    """A kernel whose module the worker has not imported is compiled in the parent while the worker
    imports it (however long that takes); the worker's next kernel from it is compiled there."""
    flag = tmp_path / "let-the-worker-import"
    (tmp_path / "kc_slow_module.py").write_text(SLOW_MODULE.format(parent=os.getpid(), flag=str(flag)))
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers get the parent's sys.path at start
    import kc_slow_module

    store = pool(1)
    [(pid, _)] = compile_processes.workers()
    first = make_spec(kc_slow_module.slow_copy, ["*fp32", "*fp32"], {"BLOCK": 64}, target="sm_90")
    compile_processes.get_or_compile(first, store)  # returns while the worker's import still waits on the flag
    counts = compile_processes.counts()
    assert counts["loading"] == 1 and counts["parent"] == 1 and counts["worker"] == 0
    assert compile_processes.workers() == [(pid, "loading")]
    flag.touch()
    wait_for(lambda: compile_processes.workers() == [(pid, "idle")])
    second = make_spec(kc_slow_module.slow_copy, ["*fp32", "*fp32"], {"BLOCK": 128}, target="sm_90")
    compile_processes.get_or_compile(second, store)
    assert compile_processes.counts()["worker"] == 1 and compile_processes.counts()["parent"] == 1
    assert store.lookup(content_key(second)) is not None
    del sys.modules["kc_slow_module"]


def release(slot) -> None:
    if slot is not None and slot != compile_processes.UNBOUNDED:
        os.close(slot)


def slot_free(memo_dir) -> bool:
    slot = compile_processes.take_slot(memo_dir, 1)
    release(slot)
    return slot is not None


def test_a_node_s_processes_share_one_bound_on_workers(tmp_path, monkeypatch):
    """The rule's pool takes one of the node's slots per worker; the worker holds it for its life
    (a neighbour process finds it held), and a worker killed frees it."""
    monkeypatch.setattr(compile_processes, "usable_cores", lambda: 16)
    monkeypatch.setattr(compile_processes, "node_slots", lambda: 1)
    compile_processes.shutdown()
    config = Config(dir=tmp_path / "cache", compile_workers=2)
    try:
        assert compile_processes.start_cold(config) == 2  # the rule wants 2: the node lets it have 1
        wait_for(lambda: [s for _, s in compile_processes.workers()] == ["idle"]
                 and compile_processes.counts()["no slot"] == 1)
        [(pid, _)] = compile_processes.workers()
        assert not slot_free(config.memo_dir)  # as a neighbour rank sees it
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: slot_free(config.memo_dir))
    finally:
        compile_processes.shutdown()


def test_slots_bound_nothing_where_the_directory_cannot_hold_them(tmp_path):
    (tmp_path / "memo").write_text("a file where the directory should be")
    assert compile_processes.take_slot(tmp_path / "memo", 1) == compile_processes.UNBOUNDED
    held = compile_processes.take_slot(tmp_path / "cache", 2)
    assert held is not None and held >= 0
    other = compile_processes.take_slot(tmp_path / "cache", 2)
    assert other is not None and other >= 0 and compile_processes.take_slot(tmp_path / "cache", 2) is None
    release(other)
    again = compile_processes.take_slot(tmp_path / "cache", 2)
    assert again is not None and again >= 0
    release(again)
    release(held)
