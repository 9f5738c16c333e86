"""A process about to compile starts its compile workers at its first Triton call, not at its first
miss: where the toolchain fingerprint must be computed (no memo of it: a new node, a new Triton), the
workers start in the background while JAX traces the rest of the jit, on a host where the pool's rule
says they pay. A process whose fingerprint memo is there (a warm node) starts none and never imports
the pool. Cross-lowered for sm_90 on a CPU host; the host's cores are set in the child."""

from __future__ import annotations

import json

from conftest import run_python

# Traces (binds, never lowers) one example program; reports the workers started by then, after the
# fingerprint's thread is done.
CHILD = """
import json, os, sys, threading, time
os.sched_getaffinity = lambda pid: set(range(16))  # a host where the rule's host part says workers pay
import jax
import kernel_cache
from kernel_cache.settings.config import Config
from lowering.examples import programs

kernel_cache.configure(Config(dir=os.environ["CACHE"], compile_workers=2))
label, fn, args = programs(compute_capability=90)[0]
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


def test_a_cold_process_starts_its_workers_at_its_first_bind_and_a_warm_one_none(tmp_path):
    env = {"CACHE": str(tmp_path / "cache")}
    cold = json.loads(run_python(CHILD, env).stdout.splitlines()[-1])
    assert cold == {"pool imported": True, "workers": ["idle", "idle"], "compiles": 0}  # before any lowering
    warm = json.loads(run_python(CHILD, env).stdout.splitlines()[-1])  # the first run left the memo
    assert warm == {"pool imported": False, "workers": [], "compiles": 0}
