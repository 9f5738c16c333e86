"""The main job: compile the example kernels into a local store cold, then warm in a fresh process.

Each phase runs in its own interpreter, as a new training job would, and reports per kernel how
long getting its binary took and which tier served it. Usage: demo.py [--dir DIR] [--arch sm_90]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def phase(arch: str) -> None:
    """Run in a child: get every example kernel through the store, print JSON rows."""
    sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    import compiler
    import kernel_cache
    from scripts.example_kernels import example_specs

    store = kernel_cache.default_store()
    rows = []
    for label, spec in example_specs(arch):
        before = store.stats.session()
        start = time.perf_counter()
        art, key = compiler.get_or_compile(spec, store)
        seconds = time.perf_counter() - start
        after = store.stats.session()
        tier = "compile" if after["compiles"] > before["compiles"] else next(
            t for t in ("memory", "disk", "shared") if after["hits"][t] > before["hits"][t])
        rows.append({"kernel": label, "seconds": seconds, "tier": tier, "key": key,
                     "bytes": len(art.cubin or art.hsaco or b"")})
    print(json.dumps({"rows": rows, "total": time.perf_counter() - t0}))


def run_phase(arch: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--phase", "--arch", arch], env=env, cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"demo phase failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.environ.get("KERNEL_CACHE_DIR") or str(ROOT / ".kernel-cache" / "demo"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--keep", action="store_true", help="do not empty the cache dir first")
    ap.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        return phase(args.arch)
    cache = Path(args.dir)
    if not args.keep and cache.exists():
        shutil.rmtree(cache)
    env = {**os.environ, "KERNEL_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    print(f"kernel-cache demo: example kernels for {args.arch}, cache dir {cache}")
    cold = run_phase(args.arch, env)
    warm = run_phase(args.arch, env)
    print(f"\n{'kernel':<18}{'cold s':>10}{'warm s':>10}{'speed-up':>10}  {'cold tier':<10}{'warm tier':<10}")
    for c, w in zip(cold["rows"], warm["rows"]):
        ratio = c["seconds"] / w["seconds"] if w["seconds"] else float("inf")
        print(f"{c['kernel']:<18}{c['seconds']:>10.4f}{w['seconds']:>10.4f}{ratio:>9.0f}x  "
              f"{c['tier']:<10}{w['tier']:<10}")
    cold_sum = sum(r["seconds"] for r in cold["rows"])
    warm_sum = sum(r["seconds"] for r in warm["rows"])
    print(f"{'total':<18}{cold_sum:>10.4f}{warm_sum:>10.4f}{cold_sum / warm_sum:>9.0f}x")
    print(f"\nprocess wall (imports included): cold {cold['total']:.2f} s, warm {warm['total']:.2f} s")


if __name__ == "__main__":
    main()
