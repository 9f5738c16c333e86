"""Several ranks of a job on one node, cold at once: their compile workers together, and the slowest lowering.

Why: the ranks of a job start together on a node whose cache is empty, and each would start its own
pool of compile workers; the node's slots (`compiler.compile_processes.take_slot`) bound them
together. This starts N processes at once, each lowering the example module as `scripts/bench_cold.py`'s `auto` path does
(the pool's own rule) on one shared KERNEL_CACHE_DIR, cross-lowered for sm_90 (N processes on one GPU
would only measure its memory), and prints per N, bounded by the slots and not (`unbounded`: each
rank's rule alone): the slowest rank's `lower`, the workers all ranks started, those refused a slot,
the kernels compiled (the store's single-flight: each once across the ranks) and the workers'
summed peak memory. Medians over --repeat fresh caches. The pool starts only on 8 or more cores.

  python scripts/bench_cold_ranks.py [--ranks 1,4,8] [--repeat 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from scripts.bench_cold import child_env, run_child  # noqa: E402


def ranks_at_once(ranks: int, bounded: bool) -> dict[str, Any]:
    """`ranks` fresh processes started together on one fresh cache; their reports summed."""
    caches = tempfile.mkdtemp(prefix="kc-bench-ranks-")
    env = {**child_env(caches, 0, False, True, "auto"), "BENCH_COLD_SLOTS": "bounded" if bounded else "unbounded"}
    reports: list[dict[str, Any]] = [{}] * ranks

    def rank(i: int) -> None:
        reports[i] = run_child("examples", "module", env, cross=True)

    try:
        threads = [threading.Thread(target=rank, args=(i,)) for i in range(ranks)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    if not all(reports):
        raise SystemExit("a rank failed (its error is above)")
    counts = [r.get("processes", {}) for r in reports]
    return {"lower": max(r["times"]["lower"] for r in reports), "wall": max(r["times"]["wall"] for r in reports),
            "started": sum(c.get("started", 0) for c in counts), "no slot": sum(c.get("no slot", 0) for c in counts),
            "on workers": sum(c.get("worker", 0) for c in counts), "compiles": sum(r.get("compiles", 0) for r in reports),
            "workers_rss_mib": sum(r.get("workers_rss_mib", 0.0) for r in reports)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="1,4,8")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeat):
        for count in (int(n) for n in args.ranks.split(",") if n):
            for bounded in (True, False):
                rows.setdefault(f"{count}/{'bounded' if bounded else 'unbounded'}", []).append(
                    ranks_at_once(count, bounded))
    print(f"ranks cold at once on one cache, cross-lowered for sm_90, {os.cpu_count()} CPUs, median of {args.repeat}")
    columns = ("lower", "wall", "started", "no slot", "on workers", "compiles", "workers_rss_mib")
    print(f"{'ranks':<7}{'slots':<11}" + "".join(f"{c.replace('_rss_mib', ' MiB'):>12}" for c in columns))
    for name, runs in rows.items():
        ranks, slots = name.split("/")
        print(f"{ranks:<7}{slots:<11}" + "".join(f"{statistics.median(r[c] for r in runs):>12.2f}" for c in columns))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
