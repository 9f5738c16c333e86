"""Child process for tests/lowering/test_job_level.py and scripts/bench_job.py: one process of a
`jax.distributed` job on loopback (CPU); reports as JSON.

    python tests/support/job_child.py lower OUT.json PORT PROCESS PROCESSES [OFF_LABELS]
        cross-lower the example programs for sm_90, one of a job of PROCESSES (1: a process alone, no
        job); first, with OFF_LABELS (comma-separated), those programs with KERNEL_CACHE_JOB=0; with
        JOB_CHILD_OUTPUTS=DIR set (on a GPU), then runs each program and saves its outputs in DIR
    python tests/support/job_child.py lease OUT.json PORT PROCESS PROCESSES holder|waiter MARK
        the job level alone, on the real client, leases of 2 s: a holder takes KEY's lease, creates
        MARK and sleeps until killed; a waiter waits for MARK, then for the lease, publishes if it
        got it, and reports what it got and how long it waited

The lowering's report: the store's counters for this process (compiles among them), the lowering's and
the whole process's seconds, the lowered text's digest, the levels, the job level's counters and mode,
and the warnings said. Each ends with os._exit (a job whose member was killed would otherwise wait at
exit for it), process 0 last.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]
KEY = "0123456789abcdef0123456789abcdef"


def _join(port: str, process: str, processes: str) -> None:
    import jax

    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=int(processes),
                               process_id=int(process), initialization_timeout=60,
                               heartbeat_timeout_seconds=30, shutdown_timeout_seconds=5)


def lower(out: str, port: str, process: str, processes: str, off_labels: str = "") -> None:
    """With `off_labels`, first those programs alone in a session of KERNEL_CACHE_JOB=0 (its own
    cache directory beside the configured one), reported under "off"; then every program."""
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import kernel_cache

        if int(processes) > 1:
            _join(port, process, processes)
        report: dict = {}
        if off_labels:
            configured = os.environ["KERNEL_CACHE_DIR"]
            os.environ.update(KERNEL_CACHE_JOB="0", KERNEL_CACHE_DIR=configured + "-off")
            kernel_cache.configure()
            report["off"] = _lowered(off_labels.split(","))
            del os.environ["KERNEL_CACHE_JOB"]
            os.environ["KERNEL_CACHE_DIR"] = configured
            kernel_cache.configure()
        report.update(_lowered(None))
    report.update(wall=time.perf_counter() - t0,
                  warnings=[str(w.message) for w in caught if "kernel" in str(w.message).lower()])
    _report(out, report, int(process), range(1, int(processes)) if int(process) == 0 else range(0))


def _lowered(labels: list[str] | None) -> dict:
    """The programs named (None: all) lowered in the current session: what it cost and counted."""
    import jax

    import kernel_cache
    from lowering.examples import programs

    start = time.perf_counter()
    digest = hashlib.sha256()
    for label, fn, shapes in programs(compute_capability=90):
        if labels is None or label in labels:
            digest.update(jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text().encode())
    lowering = time.perf_counter() - start
    if labels is None and os.environ.get("JOB_CHILD_OUTPUTS"):  # on a GPU: run them, keep what they return
        _run(Path(os.environ["JOB_CHILD_OUTPUTS"]))
    store = kernel_cache.default_store()
    job = store.level("job")
    return {"stats": store.stats.session(), "lowering": lowering, "lowered_sha": digest.hexdigest(),
            "levels": [level.name for level in store.levels],
            "job": None if job is None else {"counters": getattr(job, "counters", {}), "mode": job.mode}}


def lease(out: str, port: str, process: str, processes: str, role: str, mark: str) -> None:
    from kernel_cache.entries import entry as entry_format
    from kernel_cache.levels.job import JobLevel
    from lowering import jax_compat

    _join(port, process, processes)
    found = jax_compat.job_store()
    assert found is not None
    level = JobLevel(found[0], found[1], found[2])
    level.lease_seconds = 2.0
    if role == "holder":
        with level.lock(KEY, 30) as held:
            Path(mark).write_text(str(held))
            time.sleep(600)  # killed here
    while not Path(mark).exists():
        time.sleep(0.01)
    start = time.monotonic()
    with level.lock(KEY, 60) as got:
        waited = time.monotonic() - start
        if got:
            level.put_raw(KEY, entry_format.encode(entry_format.Entry(KEY, {"by": process}, {"cubin": b"x" * 64})))
    entry = level.get(KEY)
    _report(out, {"got": got, "waited": waited, "mode": level.mode, "counters": level.counters,
                  "published_by": None if entry is None else entry.meta["by"]},
            int(process))  # process 0 waits for none: process 1 was killed


def _run(into: Path) -> None:
    """Each program run on the same seeded inputs, its outputs saved as `into/<n>.npy`."""
    import jax
    import numpy as np

    from lowering.examples import programs

    into.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for n, (_, fn, shapes) in enumerate(programs(compute_capability=90)):
        args = [rng.standard_normal(s.shape).astype(s.dtype) for s in shapes]
        outs = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
        np.save(into / f"{n}.npy", np.stack([np.asarray(o, dtype=np.float32).ravel() for o in outs]))


def _report(out: str, report: dict, process: int = 0, others: range = range(0)) -> None:
    """Write `report` and leave; process 0 (it runs the coordinator: the job dies with it) first
    waits until each of `others` has written its own."""
    Path(out).write_text(json.dumps(report))
    if process or others:
        from jax._src import distributed

        client = distributed.global_state.client
        if process:
            client.key_value_set(f"job_child/done/{process}", "1")
        for other in others:
            client.blocking_key_value_get(f"job_child/done/{other}", 120_000)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    {"lower": lower, "lease": lease}[sys.argv[1]](*sys.argv[2:])
