"""A process about to compile starts its compile workers while it traces, not at its first miss:
where the toolchain fingerprint must be computed (no memo of it: a new node, a new Triton), the
workers start in the background at its second distinct Triton call, while JAX traces the rest of the
jit, on a host where the pool's rule says they pay. A program of one call starts none, nor does a
process whose fingerprint memo is there (a warm node), which never imports the pool. Cross-lowered
for sm_90 on a CPU host; the host's cores are set in the child."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import run_python

from kernel_cache.settings.config import Config
from lowering import first_use

# Traces (binds, never lowers) the first PROGRAMS example programs (one Triton call each); reports
# the workers started by then, after the fingerprint's thread is done.
CHILD = """
import json, os, sys, threading, time
os.sched_getaffinity = lambda pid: set(range(16))  # a host where the rule's host part says workers pay
import jax
import kernel_cache
from kernel_cache.settings.config import Config
from lowering.examples import programs

kernel_cache.configure(Config(dir=os.environ["CACHE"], compile_workers=2))
for label, fn, args in programs(compute_capability=90)[:int(os.environ["PROGRAMS"])]:
    jax.jit(fn).trace(*args)
for thread in threading.enumerate():
    if thread.name == "kernel-cache-toolchain":
        thread.join(60)
imported = "compiler.compile_processes" in sys.modules
workers = []
if imported:
    from compiler import compile_processes
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (compile_processes.workers()
                                               and all(s == "idle" for _, s in compile_processes.workers())):
        time.sleep(0.01)
    workers = [s for _, s in compile_processes.workers()]
print(json.dumps({"pool imported": imported, "workers": workers,
                  "compiles": kernel_cache.default_store().stats.session().get("compiles", 0)}))
"""


def test_a_cold_process_starts_its_workers_at_its_second_call_and_a_warm_one_none(tmp_path):
    env = {"CACHE": str(tmp_path / "cache"), "PROGRAMS": "2"}
    cold = json.loads(run_python(CHILD, env).stdout.splitlines()[-1])
    assert cold == {"pool imported": True, "workers": ["idle", "idle"], "compiles": 0}  # before any lowering
    warm = json.loads(run_python(CHILD, env).stdout.splitlines()[-1])  # the first run left the memo
    assert warm == {"pool imported": False, "workers": [], "compiles": 0}


def test_a_cold_program_of_one_call_starts_no_workers(tmp_path):
    env = {"CACHE": str(tmp_path / "cache"), "PROGRAMS": "1"}
    cold = json.loads(run_python(CHILD, env).stdout.splitlines()[-1])
    assert cold == {"pool imported": False, "workers": [], "compiles": 0}


@pytest.mark.parametrize("cold_first", [True, False])
def test_the_workers_start_once_at_the_second_distinct_call(tmp_path, monkeypatch, cold_first):
    """In either order of the fingerprint's verdict and the bindings; a call bound again (JAX
    re-tracing) is not a second call."""
    started = []
    monkeypatch.setattr(first_use, "compile_processes",
                        SimpleNamespace(start_cold=lambda config, target: started.append(target.name)))
    starter = first_use._ColdStart(Config(dir=tmp_path, compile_workers=2, target_arch="sm_90"))
    if cold_first:
        starter.cold()
    starter.bound(("add", 256))
    starter.bound(("add", 256))
    assert started == []
    starter.bound(None)  # a call without an identity: counted as another
    if not cold_first:
        assert started == [] and not starter.waiting  # as in a warm process: bindings report no more
        starter.cold()
    assert started == ["sm_90"] and not starter.waiting  # bindings report no more
    starter.bound(("add", 512))
    assert started == ["sm_90"]
