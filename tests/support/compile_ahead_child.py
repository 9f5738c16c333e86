"""Child process for tests/lowering/test_compile_ahead.py: cross-lower example programs as one module (cuda,
sm_90) in a fresh process whose configuration comes from the environment; report as JSON.

    python tests/support/compile_ahead_child.py OUT.json module [LABELS]     lower the module, report it
    python tests/support/compile_ahead_child.py OUT.json exit-early [LABELS] trace the module, lower only its
                                                                     first program, exit at once

The report: the lowered text's digest, the thread each compile ran on, every entry's blob digests.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]


def main(out: str, mode: str, labels: str = "") -> None:
    import jax

    import compiler.cache_or_compile
    import kernel_cache
    from lowering.examples import programs
    from scripts.one_module import as_one_program

    threads: list[str] = []
    real = compiler.cache_or_compile.compile_spec

    def recorded(spec):
        threads.append(threading.current_thread().name)
        return real(spec)

    compiler.cache_or_compile.compile_spec = recorded  # test scaffolding: which thread compiled what
    chosen = [p for p in programs(compute_capability=90) if not labels or p[0] in labels.split(",")]

    module, flat = as_one_program(chosen)
    report: dict = {}
    start = time.perf_counter()
    if mode == "module":
        text = jax.jit(module).trace(*flat).lower(lowering_platforms=("cuda",)).as_text()
        report["lowered_sha"] = hashlib.sha256(text.encode()).hexdigest()
    else:
        jax.jit(module).trace(*flat)  # every call bound (noted), none lowered
        _, fn, example = chosen[0]
        jax.jit(fn).trace(*example).lower(lowering_platforms=("cuda",))
    report["seconds"] = time.perf_counter() - start
    report["compile_threads"] = threads
    report["workers_started"] = sum(t.name.startswith("kernel-cache-compile-") for t in threading.enumerate())
    store = kernel_cache.default_store()
    entries = {}
    for record in store.disk.listing():
        entry = store.disk.get(record["key"])
        entries[record["key"]] = {name: hashlib.sha256(blob).hexdigest() for name, blob in entry.blobs.items()}
    report["entries"] = entries
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
