"""Benchmark the shared level: hit latency vs the local level, and N cold processes sharing a directory.

    PYTHONPATH=. python scripts/bench_shared.py [--shared-root DIR] [--procs 1 4 16] [--lock auto]

Targets: shared hit <= 1 ms on a local filesystem; compiles across N cold processes ==
distinct keys; total compile seconds of 16 cold processes <= 1.1x one process's. Wall time of N
processes is dominated by N interpreters starting on few cores: reported, not targeted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernel_cache.entries.entry import Entry  # noqa: E402
from kernel_cache.levels.disk import DiskLevel  # noqa: E402
from kernel_cache.levels.shared import SharedLevel  # noqa: E402

RANK = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from kernel_cache import default_store
from compiler import get_or_compile
from compiler.examples import example_specs
specs = example_specs("sm_90")
go = Path(sys.argv[1])
Path(sys.argv[2]).touch()  # imported and ready
while not go.exists():
    time.sleep(0.002)
t1 = time.perf_counter()
for label, spec in specs:
    get_or_compile(spec)
s = default_store().stats.session()
print(json.dumps({"compiles": s["compiles"], "compile_seconds": s["compile_seconds"],
                  "errors": s["errors"], "work_s": time.perf_counter() - t1, "keys": len(specs)}))
"""


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def bench_hits(root: Path, n: int, entry_bytes: int) -> dict[str, dict[str, float]]:
    key = "5a" * 16
    entry = Entry(key=key, meta={"kind": "bench", "created": time.time()},
                  blobs={"cubin": os.urandom(entry_bytes // 2), "ptx": os.urandom(entry_bytes // 2)})
    shared_dir = root / "shared-hits"
    shared_dir.mkdir()
    shared, disk = SharedLevel(shared_dir), DiskLevel(root / "local-hits")
    shared.put(entry)
    disk.put(entry)
    out = {}
    for name, level in (("local", disk), ("shared", shared)):
        for _ in range(20):
            level.get(key)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            level.get(key)
            times.append((time.perf_counter() - t) * 1000)
        out[name] = {"p50_ms": percentile(times, 0.5), "p95_ms": percentile(times, 0.95)}
    disk.close()
    return out


def seed_memo(root: Path) -> Path:
    """A node-warm toolchain memo, so each rank measures the cache and not hashing libtriton."""
    seed = root / "memo-seed"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "KERNEL_CACHE_DIR": str(seed)}
    subprocess.run([sys.executable, "-c", "from compiler import toolchain_fingerprint, parse_target;"
                    "toolchain_fingerprint(parse_target('sm_90'))"], env=env, check=True)
    return seed


def bench_cold(root: Path, n: int, lock: str, seed: Path) -> dict[str, Any]:
    run = root / f"cold-{n}-{lock}"
    shared = run / "shared"
    shared.mkdir(parents=True)
    go = run / "go"
    procs = []
    for i in range(n):
        node = run / f"node-{i}"
        shutil.copytree(seed, node)
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "KERNEL_CACHE_DIR": str(node),
               "KERNEL_CACHE_SHARED_DIR": str(shared), "KERNEL_CACHE_LOCK": lock}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(go), str(run / f"ready-{i}")],
                                      env=env, cwd=REPO, stdout=subprocess.PIPE, text=True))
    while sum(1 for _ in run.glob("ready-*")) < n and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    start = time.perf_counter()
    go.touch()  # ranks start their lookups together, after importing
    results = []
    for p in procs:
        out, _ = p.communicate()
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - start
    return {"procs": n, "lock": lock, "wall_s": wall,
            "compiles": sum(r["compiles"] for r in results), "distinct_keys": results[0]["keys"],
            "compile_seconds": sum(r["compile_seconds"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "slowest_rank_s": max(r["work_s"] for r in results)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-root", type=Path, help="run in this directory (e.g. on NFS or sshfs)")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--lock", default="auto", choices=["auto", "flock", "soft"])
    ap.add_argument("--hits", type=int, default=2000)
    ap.add_argument("--entry-kib", type=int, default=64, help="size of the entry for the hit benchmark")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-shared-", dir=args.shared_root))
    try:
        print(f"# {os.cpu_count()} CPUs, dir {root}")
        hits = bench_hits(root, args.hits, args.entry_kib * 1024)
        for name, h in hits.items():
            print(f"{name:6s} level hit ({args.entry_kib} KiB entry): p50 {h['p50_ms']:.3f} ms  "
                  f"p95 {h['p95_ms']:.3f} ms")
        seed = seed_memo(root)
        base = None
        for n in args.procs:
            r = bench_cold(root, n, args.lock, seed)
            base = base if base is not None else r["compile_seconds"]
            ratio = r["compile_seconds"] / base if base else float("nan")
            print(f"{n:3d} cold procs ({args.lock}): wall after imports {r['wall_s']:.2f} s, slowest rank "
                  f"{r['slowest_rank_s']:.2f} s, compiles {r['compiles']} (distinct keys "
                  f"{r['distinct_keys']}), compile seconds {r['compile_seconds']:.2f} "
                  f"({ratio:.2f}x of {args.procs[0]} proc), errors {r['errors']}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
